"""The ``first-fit`` baseline: greedy; whatever fits starts, in queue order, with no
reservations (a multi-GPU waiter can starve behind a stream of small ones).

After every event the earliest waiter (by ticket) that fits starts, on the lowest-indexed
GPUs with its need free, until none fits. Capacity only falls meanwhile, so a waiter that did
not fit cannot fit later in that walk; waiters of one demand fit or not together, so each
step looks at the first waiter of each demand only. A simulator baseline
(:mod:`~hwpool._core._baseline`): it keeps rule 1, none of the others.
"""

from __future__ import annotations

from collections import deque

from ._baseline import Baseline
from ._policy import Policy
from ._requests import Demand, Grant

__all__ = ["POLICY", "FirstFit"]


class FirstFit(Baseline):
    """Greedy first fit over the waiters per demand; see the module docstring."""

    def start_over(self) -> None:
        self.classes: dict[Demand, deque[int]] = {}  # demand -> its waiters, by ticket

    def place(self, demand: Demand, *, arriving: bool) -> tuple[int, ...] | None:
        if arriving and demand in self.classes:
            return None  # an earlier one like it waits, and does not fit
        fitting = self.placement.fitting(demand)
        return tuple(fitting[: demand.count]) if len(fitting) >= demand.count else None

    def requeue(self, ticket: int, demand: Demand, hint: float | None) -> None:
        self.classes.setdefault(demand, deque()).append(ticket)

    def unqueue(self, ticket: int) -> Demand:
        demand = self.order.unqueue(ticket)
        waiting = self.classes[demand]
        waiting.remove(ticket)  # the first of its class, but for a cancel
        if not waiting:
            del self.classes[demand]
        return demand

    def walk(self, now: float) -> list[Grant]:
        grants = []
        while (demand := self._earliest_fitting()) is not None:
            ticket = self.classes[demand][0]
            gpus = self.place(demand, arriving=False)
            assert gpus is not None, "the earliest fitting demand fits"
            self.unqueue(ticket)
            grants.append(self.granted(ticket, demand, gpus))
        return grants

    def _earliest_fitting(self) -> Demand | None:
        """The demand whose first waiter came first among the demands that fit now."""
        best: Demand | None = None
        best_ticket = -1
        ranked: list[int] = []  # free units, most first: ranked[c - 1] is the c-th most free
        for demand, waiting in self.classes.items():
            ticket = waiting[0]
            if best is not None and ticket > best_ticket:
                continue
            if not ranked:
                ranked = sorted(self.books.free, reverse=True)
            if demand.whole or demand.relative:
                fits = len(self.placement.fitting(demand)) >= demand.count
            else:
                fits = demand.count <= len(ranked) and ranked[demand.count - 1] >= demand.units
            if fits:
                best, best_ticket = demand, ticket
        return best


POLICY: type[Policy] = FirstFit
