"""Limits per owner, set by an admin (the scheduler's rule 11).

Pure, like the rest of the core. :class:`OwnerLimits` says how much one owner may have at
once: GPUs held (``gpus``, a fraction counting its share of its GPU), grants running
(``running``), units held (``units``, summed over GPUs: MiB on a server sized in memory)
and requests waiting (``queued``), and whether a request beyond the first two
waits, held (``mode="wait"``), or is refused (``mode="refuse"``). A refused request raises
:class:`LimitExceeded`; a held one stays queued, and :class:`LimitHold` says why.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from .._check import check_int, check_real

__all__ = [
    "LIMIT_MODES",
    "LimitExceeded",
    "LimitHold",
    "OwnerLimits",
    "check_limits",
    "describe_limit",
]

LIMIT_MODES = ("wait", "refuse")
"""What happens to a request beyond an owner's ``gpus`` or ``running`` limit: it waits, held,
until the owner is back under it (``wait``), or it is refused (``refuse``)."""

EPSILON = 1e-9
"""GPUs held are sums of fractions (floats): a limit is passed only beyond this."""


@dataclass(frozen=True, slots=True)
class OwnerLimits:
    """One owner's limits; None: no limit of that kind.

    ``gpus``: the most GPUs it may hold at once (a finite number > 0; a fraction of a GPU
    counts its share of that GPU); ``running``: the most grants it may hold at once (an int
    >= 1); ``units``: the most units it may hold at once, summed over its GPUs (an int >= 1;
    where units are MiB, memory); ``queued``: the most requests it may have waiting (an int
    >= 0; a request that would wait beyond it is refused, whatever the mode); ``mode``: one
    of :data:`LIMIT_MODES`. Raises TypeError/ValueError naming the field and the value.
    """

    gpus: float | None = None
    running: int | None = None
    queued: int | None = None
    mode: str = "wait"
    units: int | None = None

    def __post_init__(self) -> None:
        if self.gpus is not None:
            number = check_real("gpus", self.gpus)
            if not (math.isfinite(number) and number > 0):
                raise ValueError(f"gpus must be a finite number > 0, got {self.gpus!r}")
        if self.running is not None:
            check_int("running", self.running, minimum=1)
        if self.queued is not None:
            check_int("queued", self.queued, minimum=0)
        if self.units is not None:
            check_int("units", self.units, minimum=1)
        if not isinstance(self.mode, str):
            raise TypeError(f"mode must be a str, got {self.mode!r} ({type(self.mode).__name__})")
        if self.mode not in LIMIT_MODES:
            raise ValueError(f"mode must be one of {', '.join(LIMIT_MODES)}; got {self.mode!r}")

    @property
    def active(self) -> bool:
        """Whether any limit is set."""
        return any(x is not None for x in (self.gpus, self.running, self.queued, self.units))


def describe_limit(limit: str, value: float) -> str:
    """``2 GPUs held at once``, ``1 running grant``, ``3 waiting requests``: a limit in words."""
    if limit == "gpus":
        return f"{value:g} GPU{'' if value == 1 else 's'} held at once"
    if limit == "units":
        return f"{value:g} unit{'' if value == 1 else 's'} held at once"
    if limit == "running":
        return f"{value:g} running grant{'' if value == 1 else 's'}"
    return f"{value:g} waiting request{'' if value == 1 else 's'}"


class LimitExceeded(ValueError):
    """A request refused by its owner's limit (rule 11): ``owner``, the ``limit`` by name
    (``gpus``, ``units``, ``running`` or ``queued``), the ``allowed`` value and the ``value`` the
    request would have made it, and ``why`` in words. The scheduler's state is unchanged."""

    def __init__(self, owner: Hashable, limit: str, allowed: float, value: float, why: str):
        self.owner = owner
        self.limit = limit
        self.allowed = allowed
        self.value = value
        self.why = why
        super().__init__(
            f"owner {owner!r} is limited to {describe_limit(limit, allowed)} ({limit}={allowed:g});"
            f" {why}"
        )


class LimitHold(NamedTuple):
    """Why a waiter is held (rule 11): its ``owner`` has ``used`` of its ``limit`` (``gpus``,
    ``units`` or ``running``; counting what its earlier reserving waiters keep), ``allowed``
    at most, and the waiter needs ``need`` more."""

    owner: Hashable
    limit: str
    allowed: float
    used: float
    need: float

    def __str__(self) -> str:
        return (
            f"held: owner {self.owner!r} at its limit of {describe_limit(self.limit, self.allowed)}"
            f" (has {self.used:g}, needs {self.need:g} more)"
        )


def check_limits(
    limits: object, default_limits: object
) -> tuple[dict[Hashable, OwnerLimits], OwnerLimits | None]:
    """``limits`` (owner -> OwnerLimits) and ``default_limits`` checked; TypeError naming the
    argument, the owner and the value otherwise."""
    checked: dict[Hashable, OwnerLimits] = {}
    if limits is not None:
        if not isinstance(limits, Mapping):
            raise TypeError(
                f"limits must be a mapping of owner to OwnerLimits, got {limits!r} "
                f"({type(limits).__name__})"
            )
        for owner, limit in limits.items():
            if not isinstance(limit, OwnerLimits):
                raise TypeError(
                    f"limits[{owner!r}] must be an OwnerLimits, got {limit!r} "
                    f"({type(limit).__name__})"
                )
            checked[owner] = limit
    if default_limits is not None and not isinstance(default_limits, OwnerLimits):
        raise TypeError(
            f"default_limits must be an OwnerLimits or None, got {default_limits!r} "
            f"({type(default_limits).__name__})"
        )
    return checked, default_limits
