"""Leases that use more GPU memory than they were leased, and what the server does about it.

A lease's allowance on a GPU (:class:`LeaseShare`) is its memory in MiB (a memory lease) or
its fraction of the GPU's memory (a fraction lease: a quarter of an 80 GiB GPU is 20 GiB); on
a GPU it does not hold, it is 0. Its use there is what its processes hold (see
:mod:`._attribute`). Use above the allowance flags it (:class:`OverUse`) at once, on every
sample while it lasts; what follows depends on the policy (:class:`OverLeasePolicy`):

- ``warn`` (the default): ``warn`` is True on the first sample over, to log it and tell the
  job's stderr once;
- ``term``: the same, and ``end`` is True, once, when the lease has been over for ``grace_s``
  seconds: the server sends its process group SIGTERM and ends the lease for overuse;
- ``off``: flagged in status only; nothing is said or done.

A sample back within the allowance (or with none of the lease's processes left on the GPU)
clears the flag and restarts the grace. A sample whose use (or, for a fraction, the GPU's
total) is unknown keeps the flag as it was and decides nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .._check import check_int, check_real
from ._sample import Sample

__all__ = ["LeaseShare", "OverLeasePolicy", "OverLeaseWatch", "OverUse", "parse_policy"]


class OverLeasePolicy(enum.Enum):
    """What the server does about a lease over its memory (see the module docstring)."""

    WARN = "warn"
    TERM = "term"
    OFF = "off"


def parse_policy(value: object, name: str = "over_lease") -> OverLeasePolicy:
    """``value`` (``"warn"``, ``"term"``, ``"off"`` or a policy) as a policy; TypeError or
    ValueError naming ``name`` and the value otherwise."""
    if isinstance(value, OverLeasePolicy):
        return value
    choices = ", ".join(repr(p.value) for p in OverLeasePolicy)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {choices}, got {value!r} ({type(value).__name__})")
    try:
        return OverLeasePolicy(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}") from None


@dataclass(frozen=True)
class LeaseShare:
    """What lease ``lease`` may use on the GPU ``gpu`` (a UUID): ``memory_mib``, or
    ``fraction`` of the GPU's memory (exactly one), under ``policy``."""

    lease: int
    gpu: str
    memory_mib: int | None = None
    fraction: Fraction | None = None
    policy: OverLeasePolicy = OverLeasePolicy.WARN

    def __post_init__(self) -> None:
        if (self.memory_mib is None) == (self.fraction is None):
            raise TypeError(
                f"give memory_mib or fraction, exactly one (memory_mib={self.memory_mib!r}, "
                f"fraction={self.fraction!r})"
            )
        if self.memory_mib is not None:
            check_int("memory_mib", self.memory_mib, minimum=1)
        elif not 0 < check_real("fraction", self.fraction) <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction!r}")
        object.__setattr__(self, "policy", parse_policy(self.policy, "policy"))  # "term" too

    def allowed_mib(self, total_mib: int | None) -> int | None:
        """The MiB allowed on a GPU of ``total_mib`` (rounded down); None if that is unknown
        and needed."""
        if self.memory_mib is not None:
            return self.memory_mib
        if total_mib is None or self.fraction is None:
            return None
        return int(Fraction(self.fraction) * total_mib)


@dataclass(frozen=True)
class OverUse:
    """A lease over its allowance on one GPU since ``since``, and what to do now: ``warn``
    (say so, once) and ``end`` (SIGTERM its group and end it, once)."""

    lease: int
    gpu: str
    used_mib: int
    allowed_mib: int
    since: float
    policy: OverLeasePolicy
    warn: bool = False
    end: bool = False


class OverLeaseWatch:
    """Flags leases over their allowance, sample after sample, with the ``term`` grace."""

    def __init__(self, grace_s: float = 30.0) -> None:
        grace = check_real("grace_s", grace_s)
        if not 0.0 <= grace < float("inf"):
            raise ValueError(f"grace_s must be >= 0 and finite, got {grace_s!r}")
        self.grace_s = grace
        self._over: dict[tuple[int, str], OverUse] = {}
        self._ended: set[int] = set()

    def observe(
        self,
        sample: Sample,
        use: Mapping[tuple[int, str], int | None],
        shares: Sequence[LeaseShare],
        now: float,
    ) -> list[OverUse]:
        """The flags after one ``sample``: ``use`` per (lease, GPU UUID) in MiB (None: some
        of it unknown; absent: none of the lease's processes there), and the live leases'
        ``shares``. On a GPU whose process list ``sample`` could not read (or does not list)
        every lease's use is unknown. A lease with no share on a GPU it uses may use nothing
        there; a lease absent from ``shares`` is gone and forgotten."""
        totals = {gpu.uuid: gpu.total_mib for gpu in sample.gpus}
        listed = {gpu.uuid for gpu in sample.gpus if gpu.processes is not None}
        by_key = {(s.lease, s.gpu): s for s in shares}
        live = {s.lease for s in shares}
        flags = []
        for key in sorted(set(use) | set(self._over)):
            used = use.get(key, 0) if key[1] in listed else None
            if key[0] in live and (flag := self._step(key, used, by_key, totals, now)):
                flags.append(flag)
        self._over = {key: flag for key, flag in self._over.items() if key[0] in live}
        self._ended &= live
        return flags

    def _step(
        self,
        key: tuple[int, str],
        used: int | None,
        shares: Mapping[tuple[int, str], LeaseShare],
        totals: Mapping[str, int | None],
        now: float,
    ) -> OverUse | None:
        """One (lease, GPU)'s flag after this sample, kept in ``_over``; None when within."""
        share = shares.get(key)
        allowed = share.allowed_mib(totals.get(key[1])) if share else 0
        policy = share.policy if share else self._policy_of(key[0], shares)
        before = self._over.get(key)
        if used is None or allowed is None:
            return _quiet(before) if before else None  # unknown: as it was, nothing to do
        if used <= allowed:
            self._over.pop(key, None)
            return None
        since = before.since if before else now
        end = self._due(key[0], policy, since, now)
        flag = OverUse(key[0], key[1], used, allowed, since, policy, before is None, end)
        self._over[key] = flag
        return flag if policy is not OverLeasePolicy.OFF else _quiet(flag)

    def _due(self, lease: int, policy: OverLeasePolicy, since: float, now: float) -> bool:
        """Whether to end ``lease`` now: ``term``, over for the grace, not ended already."""
        if policy is not OverLeasePolicy.TERM or lease in self._ended:
            return False
        if now - since < self.grace_s:
            return False
        self._ended.add(lease)
        return True

    @staticmethod
    def _policy_of(lease: int, shares: Mapping[tuple[int, str], LeaseShare]) -> OverLeasePolicy:
        """The policy of ``lease`` from any of its shares (the same on all of them)."""
        return next((s.policy for (i, _), s in shares.items() if i == lease), OverLeasePolicy.WARN)


def _quiet(flag: OverUse) -> OverUse:
    """``flag`` with nothing to say or do (policy ``off``)."""
    return OverUse(flag.lease, flag.gpu, flag.used_mib, flag.allowed_mib, flag.since, flag.policy)
