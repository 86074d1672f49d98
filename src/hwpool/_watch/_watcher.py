"""One watcher step: sample the GPUs, attribute their processes, update the hysteresis and
the over-lease flags. The server calls :meth:`Watcher.observe` once per interval, off its
event loop (a sample blocks on NVML or on nvidia-smi), with the leases it holds now.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._attribute import Attributed, LeaseProcs, attribute, lease_use_mib, outside_mib, user_name
from ._hold import HoldRule, OutsideHold
from ._overlease import LeaseShare, OverLeaseWatch, OverUse
from ._procfs import ProcFS, ProcReader
from ._sample import Sample, Sampler

__all__ = ["WatchReport", "Watcher"]


@dataclass(frozen=True)
class WatchReport:
    """What one step found: the ``sample``, every GPU process with its lease (``processes``),
    the MiB to withhold per GPU UUID (``withheld_mib``) and the leases over their memory."""

    sample: Sample
    processes: tuple[Attributed, ...]
    withheld_mib: dict[str, int]
    over: tuple[OverUse, ...]

    @property
    def outside(self) -> tuple[Attributed, ...]:
        """The processes outside the queue (pid, GPU, memory, uid, user): for ``status``;
        not the unknown ones (see :class:`~._attribute.Attributed`)."""
        return tuple(item for item in self.processes if item.outside)


class Watcher:
    """Holds a sampler and the state kept between samples (hysteresis, over-lease timers)."""

    def __init__(
        self,
        sampler: Sampler,
        *,
        rule: HoldRule | None = None,
        grace_s: float = 30.0,
        procs: ProcReader | None = None,
        name_of: Callable[[int], str] = user_name,
    ) -> None:
        self.sampler = sampler
        self.hold = OutsideHold(rule)
        self.over = OverLeaseWatch(grace_s)
        self._procs = procs or ProcFS()
        self._name_of = name_of

    def observe(
        self, leases: Sequence[LeaseProcs], shares: Sequence[LeaseShare], now: float
    ) -> WatchReport:
        """Sample now and return what was found; never raises for a driver failure."""
        sample = self.sampler.sample()
        found = attribute(sample.processes, leases, self._procs, self._name_of)
        withheld = self.hold.observe(outside_mib(sample, found), now)
        over = self.over.observe(sample, lease_use_mib(found), shares, now)
        return WatchReport(sample, tuple(found), withheld, tuple(over))

    def close(self) -> None:
        """Release the sampler."""
        self.sampler.close()
