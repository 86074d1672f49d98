"""How much memory held outside the queue to take out of what is shared: with hysteresis.

A process outside the queue (someone's ``python train.py``) holds GPU memory the queue would
otherwise hand out. The watcher withholds that memory from the queue, but not at the first
sight of it: a short spike must not reshuffle the queue. The rule, per GPU, on each sample of
the memory outside the queue (``seen``, MiB; None when unknown):

- *taking*: once ``seen`` has stayed above what is withheld for ``take_samples`` samples in a
  row, spanning at least ``take_seconds``, the withheld amount rises to the *least* seen in
  that run (what persisted, not the peak of a spike);
- *giving back*: once ``seen`` has stayed below what is withheld for ``give_samples`` samples
  in a row, the withheld amount falls to the *most* seen in that run (what may still be
  there);
- a sample equal to what is withheld ends either run; an unknown sample changes nothing
  (a run neither grows nor ends: a failed poll is not evidence either way).

So what is withheld is always 0 or an amount that was seen, never more than the memory
outside the queue has been for a whole run. An amount that stays the same is withheld exactly
within two runs (the first may have begun before it, and settle in between); a run lasts the
rule's count of samples, and one more where ``take_seconds`` must pass (its first sample
starts the clock). :func:`hold_step` is the pure transition;
:class:`OutsideHold` keeps one state per GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .._check import check_int, check_real

__all__ = ["Hold", "HoldRule", "OutsideHold", "hold_step"]

_RISING, _STEADY, _FALLING = 1, 0, -1


@dataclass(frozen=True)
class HoldRule:
    """The hysteresis: samples (and seconds) before taking memory, samples before giving it
    back. TypeError or ValueError, naming the argument, for a count below 1 or a negative or
    non-finite time."""

    take_samples: int = 3
    take_seconds: float = 0.0
    give_samples: int = 3

    def __post_init__(self) -> None:
        check_int("take_samples", self.take_samples, minimum=1)
        check_int("give_samples", self.give_samples, minimum=1)
        seconds = check_real("take_seconds", self.take_seconds)
        if not 0.0 <= seconds < float("inf"):
            raise ValueError(f"take_seconds must be >= 0 and finite, got {self.take_seconds!r}")


@dataclass(frozen=True)
class Hold:
    """One GPU's state: ``withheld`` MiB, and the current run: its direction (``trend``: +1
    rising, -1 falling, 0 none), its length, when it began and its bound (the least seen in a
    rising run, the most in a falling one)."""

    withheld: int = 0
    trend: int = _STEADY
    count: int = 0
    since: float = 0.0
    bound: int = 0


def hold_step(hold: Hold, seen: int | None, now: float, rule: HoldRule) -> Hold:
    """The state after one sample ``seen`` (MiB outside the queue, None: unknown) at ``now``."""
    if seen is None:
        return hold
    trend = _RISING if seen > hold.withheld else _FALLING if seen < hold.withheld else _STEADY
    if trend == _STEADY:
        return Hold(hold.withheld)
    if trend != hold.trend:
        hold = Hold(hold.withheld, trend, 0, now, seen)
    tighter = min if trend == _RISING else max
    hold = Hold(hold.withheld, trend, hold.count + 1, hold.since, tighter(hold.bound, seen))
    if _due(hold, now, rule):
        return Hold(hold.bound)
    return hold


def _due(hold: Hold, now: float, rule: HoldRule) -> bool:
    """Whether the current run has lasted long enough to move what is withheld."""
    if hold.trend == _FALLING:
        return hold.count >= rule.give_samples
    return hold.count >= rule.take_samples and now - hold.since >= rule.take_seconds


class OutsideHold:
    """The hysteresis for every GPU: feed each sample's outside memory, read what to withhold.

    A GPU missing from a sample counts as unknown there; a GPU never seen withholds nothing.
    """

    def __init__(self, rule: HoldRule | None = None) -> None:
        self.rule = rule or HoldRule()
        self._holds: dict[str, Hold] = {}

    def observe(self, seen: Mapping[str, int | None], now: float) -> dict[str, int]:
        """Step every GPU in ``seen`` (UUID -> MiB or None) and return the MiB to withhold
        on every GPU seen so far."""
        for uuid, mib in seen.items():
            self._holds[uuid] = hold_step(self._holds.get(uuid, Hold()), mib, now, self.rule)
        return self.withheld()

    def withheld(self) -> dict[str, int]:
        """The MiB to withhold now, per GPU UUID."""
        return {uuid: hold.withheld for uuid, hold in self._holds.items()}
