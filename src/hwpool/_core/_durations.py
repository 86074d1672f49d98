"""Hold times the scheduling core has observed, and when each running grant should end.

The pool is never told how long work runs; it sees each grant's start and release. This
learns, per demand class, a smoothed mean of the hold times and of their spread, and from
them estimates when every running grant (and so every GPU) will have room again. Pure: time
comes in as an argument, from the core's caller.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["SMOOTHING", "SPREADS", "Durations"]

SMOOTHING = 0.3
"""Weight of the newest hold time in a class's moving averages (exponential smoothing)."""

SPREADS = 2.0
"""A candidate for backfill is judged by its class's mean plus this many mean deviations."""


@dataclass(slots=True)
class _Run:
    start: float
    key: Hashable | None  # None: not learned from (a restored grant)
    hint: float | None
    held: dict[int, int]  # GPU -> units still held


class Durations:
    """Per-class hold-time averages and the running grants, per GPU."""

    __slots__ = ("_classes", "_count", "_on_gpu", "_runs", "_squares", "_total")

    def __init__(self, num_gpus: int) -> None:
        self._classes: dict[Hashable, list[float]] = {}  # key -> [mean, mean deviation]
        self._total = self._squares = 0.0  # over every class: for the mean and its spread
        self._count = 0
        self._runs: dict[int, _Run] = {}
        self._on_gpu: list[dict[int, int]] = [{} for _ in range(num_gpus)]

    # ----------------------------------------------------------------- learning
    def start(
        self,
        ticket: int,
        key: Hashable | None,
        held: dict[int, int],
        now: float,
        hint: float | None = None,
    ) -> None:
        """Record a grant that starts at ``now`` holding ``held`` (GPU -> units)."""
        self._runs[ticket] = _Run(now, key, hint, dict(held))
        for gpu, units in held.items():
            self._on_gpu[gpu][ticket] = units

    def finish(self, ticket: int | None, gpu: int, units: int, now: float) -> None:
        """Record ``units`` given back on ``gpu`` at ``now``, by ``ticket`` if known.

        Without a ticket (or with one not running there) the units are taken from a run
        holding exactly that much there, else from the oldest ones, and nothing is learned
        from those (the guess may be wrong). A run whose every part is back teaches its class
        its hold time.
        """
        on_gpu = self._on_gpu[gpu]
        if ticket is not None and ticket in on_gpu:
            self._take(ticket, gpu, units, now)
            return
        while units > 0 and on_gpu:  # unknown: exactly that much if one holds it, else oldest
            guess = next((t for t, held in on_gpu.items() if held == units), next(iter(on_gpu)))
            self._runs[guess].key = None
            taken = min(units, on_gpu[guess])
            self._take(guess, gpu, taken, now)
            units -= taken

    def _take(self, ticket: int, gpu: int, units: int, now: float) -> None:
        on_gpu, run = self._on_gpu[gpu], self._runs[ticket]
        left = on_gpu[ticket] - units
        if left > 0:
            on_gpu[ticket] = run.held[gpu] = left
            return
        del on_gpu[ticket]
        del run.held[gpu]
        if not run.held:
            del self._runs[ticket]
            if run.key is not None:
                self._learn(run.key, max(0.0, now - run.start))

    def _learn(self, key: Hashable, seconds: float) -> None:
        stats = self._classes.get(key)
        if stats is None:
            self._classes[key] = [seconds, 0.0]
        else:
            error = seconds - stats[0]
            stats[0] += SMOOTHING * error
            stats[1] += SMOOTHING * (abs(error) - stats[1])
        self._total += seconds
        self._squares += seconds * seconds
        self._count += 1

    # ----------------------------------------------------------------- estimates
    def mean(self, key: Hashable | None = None) -> float | None:
        """The smoothed hold time of ``key``'s class, else the mean over all; None if none."""
        stats = self._classes.get(key) if key is not None else None
        if stats is not None:
            return stats[0]
        return self._total / self._count if self._count else None

    def guess(self, key: Hashable, hint: float | None = None) -> float | None:
        """A cautious hold time for a request not yet granted: ``hint`` if given, else its
        class's mean plus :data:`SPREADS` mean deviations, else the mean over all plus as
        many standard deviations; None while nothing has been seen."""
        if hint is not None:
            return hint
        stats = self._classes.get(key)
        if stats is not None:
            return stats[0] + SPREADS * stats[1]
        if not self._count:
            return None
        mean = self._total / self._count
        spread = math.sqrt(max(0.0, self._squares / self._count - mean * mean))
        return mean + SPREADS * spread

    def end_of(self, ticket: int, now: float) -> float:
        """When the running grant ``ticket`` is expected to end (never before ``now``).

        Expected: its start plus its hint or its class's mean. A run with no estimate, or past
        it, is expected to run as long again as it has (at least the mean over all): the
        longer work has run, the longer it tends to go on.
        """
        run = self._runs[ticket]
        expected = run.hint if run.hint is not None else self.mean(run.key)
        if expected is not None and run.start + expected > now:
            return run.start + expected
        return now + max(now - run.start, self.mean() or 0.0)

    def held_on(self, gpu: int) -> dict[int, int]:
        """The running grants on ``gpu``: ticket -> units held there."""
        return self._on_gpu[gpu]

    def free_at(self, gpu: int, free: int, units: int, now: float) -> float:
        """When ``gpu`` (``free`` units free now) is expected to have ``units`` free."""
        if free >= units:
            return now
        ends = sorted((self.end_of(t, now), held) for t, held in self._on_gpu[gpu].items())
        for end, held in ends:
            free += held
            if free >= units:
                return end
        return ends[-1][0] if ends else now  # units held outside any known run: unknown

    def free_by(self, gpu: int, free: int, when: float, now: float) -> int:
        """Units expected free on ``gpu`` at ``when``: ``free`` now plus the runs ending by then."""
        for ticket, held in self._on_gpu[gpu].items():
            if self.end_of(ticket, now) <= when:
                free += held
        return free

    def is_running(self, ticket: int) -> bool:
        return ticket in self._runs
