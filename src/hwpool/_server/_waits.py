"""Why each request in the host server's queue waits, and when it should start (issue 37).

The host state hands in what its books hold (each lease's core grant, start, demand and hint;
each waiter's ticket and hint) and gets the core's explanation of every waiter
(:func:`hwpool._core._explain.explain`): a reason, a detail in words and an estimated start on
the state's clock. Waiters the server itself keeps from the core (held back while it
recovers) are the status's own business: they are not in the core.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from .._core._explain import Explanation, Reason, Running, explain
from .._core._memory import format_mib
from .._core._scheduler import Demand, Grant, Scheduler

__all__ = ["KEEP_S", "HeldLease", "Kept", "describe_units", "explain_waiters"]

KEEP_S = 1.0
"""Seconds an explanation of the queue is reused while nothing in the queue or the leases
changed: every ``hwpool run`` that waits asks for the status about once a second, and one
explanation copies the scheduler and replays its queue."""


class HeldLease(NamedTuple):
    """A lease as the host state's books hold it: the core's ``ticket`` of its grant, what it
    holds (``held``: GPU -> units), when it was granted (``since``), its demand, and when it
    ends at the latest if the server knows (``ends_by``: a revoked lease's hold; None)."""

    ticket: int
    held: Mapping[int, int]
    since: float
    demand: Demand
    hint: float | None = None
    ends_by: float | None = None


def describe_units(sized_in_memory: bool, units_per_gpu: int) -> Callable[[int], str]:
    """How a detail writes an amount of units: MiB on a server sized in memory, else a share
    of a GPU (``0.5 GPU``)."""
    if sized_in_memory:
        return format_mib

    def share(units: int) -> str:
        return f"{units / units_per_gpu:.3g} GPU"

    return share


def explain_waiters(
    core: Scheduler,
    leases: Iterable[HeldLease],
    hints: Mapping[int, float],
    now: float,
    describe: Callable[[int], str],
    *,
    outside: Mapping[int, tuple[Reason, str]] | None = None,
) -> dict[int, Explanation]:
    """Every waiter of ``core`` explained, by its ticket. ``hints``: the hold time a waiter's
    client expects (by ticket); ``outside``: waiters the server holds for its own reason
    (a drained server's: ticket -> ``(Reason.DRAINING, detail)``). A lease whose parts the
    core cannot name as one grant (one released in part, unevenly) is planned never to end:
    its room is unknown."""
    totals = core.totals
    running: list[Running] = []
    expected = dict(hints)
    for lease in leases:
        grant = _grant_of(lease, totals)
        if grant is None:
            continue
        running.append(Running(grant, lease.since, lease.demand))
        hold = lease.hint
        if lease.ends_by is not None:
            by = max(0.0, lease.ends_by - lease.since)
            hold = by if hold is None else min(hold, by)
        if hold is not None:
            expected[lease.ticket] = hold
    found = explain(core, running, now=now, hints=expected, describe=describe, outside=outside)
    return {e.ticket: e for e in found}


class Kept:
    """The last explanation, reused while the state's change count is the same and it is
    younger than :data:`KEEP_S` (planned ends move with the clock only for work past its
    expected end)."""

    __slots__ = ("_at", "_changes", "_found")

    def __init__(self) -> None:
        self._changes = -1
        self._at = -math.inf
        self._found: dict[int, Explanation] = {}

    def get(
        self, changes: int, now: float, explain_now: Callable[[], dict[int, Explanation]]
    ) -> dict[int, Explanation]:
        """The explanation at ``changes`` (the state's count of changes), made anew by
        ``explain_now`` unless one was made at that count less than KEEP_S ago."""
        if changes != self._changes or not 0.0 <= now - self._at < KEEP_S:
            self._found = explain_now()
            self._changes, self._at = changes, now
        return self._found


def _grant_of(lease: HeldLease, totals: tuple[int, ...]) -> Grant | None:
    """The core's grant that ``lease`` still holds, or None if no one grant is it."""
    gpus = tuple(sorted(lease.held))
    amounts = {lease.held[gpu] for gpu in gpus}
    if not gpus:
        return None
    if len(amounts) == 1:
        return Grant(lease.ticket, gpus, amounts.pop())
    if all(lease.held[gpu] == totals[gpu] for gpu in gpus):
        return Grant(lease.ticket, gpus, 0)  # whole GPUs of different sizes
    return None
