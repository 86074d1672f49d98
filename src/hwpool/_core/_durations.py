"""Hold times the scheduling core has observed, and when each running grant should end.

The pool is never told how long work runs; it sees each grant's start and release. This
learns, per demand class, a smoothed mean of the hold times, and from it estimates when
every running grant (and so every GPU) will have room again. Pure: time
comes in as an argument, from the core's caller.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from ._fairshare import Account, Usage

__all__ = ["SMOOTHING", "Durations"]

SMOOTHING = 0.3
"""Weight of the newest hold time in a class's moving average (exponential smoothing)."""


# A running grant: [start, key, hint, held, account, limit], a list for speed (it is made on
# every grant). key None: not learned from (a restored grant, a guessed release); held: GPU ->
# units still held (the caller's dict, not copied); account: its owner's usage (None: not
# counted); limit: the hold time its caller enforces (None: none).
_Run = list[Any]
_START, _KEY, _HINT, _HELD, _ACCOUNT, _LIMIT = range(6)


_FOLD_AT = 1024
"""Hold times kept unlearned at most: past that many, they are folded into the means."""


class Durations:
    """Per-class hold-time averages and the running grants, per GPU; ``usage``, if given,
    hears what each grant that carries an account gives back (owners' usage, rule 8 of the
    scheduler), so that the core keeps one record per running grant.

    A grant that ends only appends its class and hold time to a list: the averages are
    brought up to date from it, in the order the grants ended, when an estimate is asked
    for (or when the list grows long), so that learning costs a release next to nothing
    while nobody waits (nobody then asks)."""

    __slots__ = ("_classes", "_count", "_ended", "_on_gpu", "_runs", "_total", "_usage")

    def __init__(self, num_gpus: int, usage: Usage | None = None) -> None:
        self._usage = usage
        self._classes: dict[Hashable, float] = {}  # key -> smoothed mean hold time
        self._total = 0.0  # over every class, for the plain mean
        self._count = 0
        self._ended: list[tuple[Hashable, float]] = []  # (key, hold time) not yet learned
        self._runs: dict[int, _Run] = {}
        self._on_gpu: list[dict[int, int]] = [{} for _ in range(num_gpus)]

    # ----------------------------------------------------------------- learning
    def start(  # noqa: PLR0917 (positional on the hot path: every grant)
        self,
        ticket: int,
        key: Hashable | None,
        held: dict[int, int],
        now: float,
        hint: float | None = None,
        account: Account | None = None,
        limit: float | None = None,
    ) -> None:
        """Record a grant that starts at ``now`` holding ``held`` (GPU -> units; kept);
        ``account``: its owner's, told what it gives back; ``limit``: the hold time its
        caller enforces, so that it surely ends by ``now + limit``."""
        self._runs[ticket] = [now, key, hint, held, account, limit]
        for gpu, units in held.items():
            self._on_gpu[gpu][ticket] = units

    def count_running(
        self, hold_since: Callable[[Mapping[int, int], float, float], Account], now: float
    ) -> None:
        """Give every running grant without an account the one ``hold_since(held, start,
        now)`` opens for it (the default owner's, counted from its start)."""
        for run in self._runs.values():
            if run[_ACCOUNT] is None:
                run[_ACCOUNT] = hold_since(run[_HELD], run[_START], now)

    def finish(self, ticket: int | None, gpu: int, units: int, now: float) -> None:
        """Record ``units`` given back on ``gpu`` at ``now``, by ``ticket`` if known.

        Without a ticket (or with one not running there) the units are taken from a run
        holding exactly that much there, else from the oldest ones, and nothing is learned
        from those (the guess may be wrong). A run whose every part is back teaches its class
        its hold time.
        """
        on_gpu = self._on_gpu[gpu]
        if ticket is not None and (there := on_gpu.get(ticket)) is not None:
            run = self._runs[ticket]
            if there == units and len(run[_HELD]) == 1:  # the common case, inline
                del on_gpu[ticket], self._runs[ticket]
                if run[_ACCOUNT] is not None and self._usage is not None:
                    self._usage.drop(run[_ACCOUNT], gpu, units, now, True)
                key = run[_KEY]
                if key is not None:  # self._learn(key, ...), inline
                    ended = self._ended
                    ended.append((key, now - run[_START]))
                    if len(ended) > _FOLD_AT:
                        self._fold()
            else:
                self._take(ticket, gpu, units, now)
            return
        while units > 0 and on_gpu:  # unknown: exactly that much if one holds it, else oldest
            guess = next((t for t, held in on_gpu.items() if held == units), next(iter(on_gpu)))
            self._runs[guess][_KEY] = None
            taken = min(units, on_gpu[guess])
            self._take(guess, gpu, taken, now)
            units -= taken

    def forget_runs(self) -> None:
        """Drop every running grant, keeping what was learned (for ``Scheduler.rebuild``)."""
        self._runs.clear()
        for on_gpu in self._on_gpu:
            on_gpu.clear()

    def _take(self, ticket: int, gpu: int, units: int, now: float) -> None:
        on_gpu, run = self._on_gpu[gpu], self._runs[ticket]
        held = run[_HELD]
        left = on_gpu[ticket] - units
        if run[_ACCOUNT] is not None and self._usage is not None:
            ended = left <= 0 and len(held) == 1
            self._usage.drop(run[_ACCOUNT], gpu, min(units, on_gpu[ticket]), now, ended)
        if left > 0:
            on_gpu[ticket] = held[gpu] = left
            return
        del on_gpu[ticket], held[gpu]
        if not held:
            del self._runs[ticket]
            if run[_KEY] is not None:
                self._learn(run[_KEY], max(0.0, now - run[_START]))

    def _learn(self, key: Hashable, seconds: float) -> None:
        """Learn a grant of class ``key`` held ``seconds`` (see :meth:`_fold`)."""
        self._ended.append((key, seconds))
        if len(self._ended) > _FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        """Bring the averages up to date with the hold times ended since, in their order
        (exactly what learning each at its release would have given)."""
        ended, self._ended = self._ended, []
        classes, smoothing, total = self._classes, SMOOTHING, self._total
        for key, seconds in ended:
            mean = classes.get(key)
            classes[key] = seconds if mean is None else mean + smoothing * (seconds - mean)
            total += seconds
        self._total, self._count = total, self._count + len(ended)

    # ----------------------------------------------------------------- estimates
    def mean(self, key: Hashable | None = None) -> float | None:
        """The smoothed hold time of ``key``'s class, else the mean over all; None if none."""
        if self._ended:
            self._fold()
        mean = self._classes.get(key) if key is not None else None
        if mean is not None:
            return mean
        return self._total / self._count if self._count else None

    def guess(self, key: Hashable, hint: float | None = None) -> float | None:
        """The hold time to assume for a request not yet granted: ``hint`` if given, else
        :meth:`mean`."""
        return hint if hint is not None else self.mean(key)

    def end_of(self, ticket: int, now: float) -> float:
        """When the running grant ``ticket`` is expected to end (never before ``now``).

        Expected: its start plus its hint or its class's mean. One past that is expected to
        run as long again as it has (at least the mean over all): the longer work has run,
        the longer it tends to go on. Before any hold time is known at all, ``now``: nothing
        is promised, so a head's shadow is now. A grant with an enforced limit ends by its
        start plus the limit, whatever is expected (with nothing known, then).
        """
        run = self._runs[ticket]
        start: float = run[_START]
        expected = run[_HINT] if run[_HINT] is not None else self.mean(run[_KEY])
        limit: float | None = run[_LIMIT]
        if expected is None:
            return now if limit is None else max(now, start + limit)
        if start + expected > now:
            end = start + expected
        else:
            end = now + max(now - start, self.mean() or 0.0)
        if limit is not None and start + limit < end:
            return max(now, start + limit)
        return end

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

    def free_by(self, gpu: int, free: int, when: float, now: float, expected: bool) -> int:
        """Units free on ``gpu`` at ``when``: ``free`` now plus what the runs whose enforced
        limits end by then hold (estimates promise nothing), or, if ``expected``, plus what
        the runs expected to end by then hold."""
        if expected:
            for ticket, held in self._on_gpu[gpu].items():
                if self.end_of(ticket, now) <= when:
                    free += held
            return free
        runs = self._runs
        for ticket, held in self._on_gpu[gpu].items():
            run = runs[ticket]
            limit = run[_LIMIT]
            if limit is not None and run[_START] + limit <= when:
                free += held
        return free
