"""The ``fifo`` baseline: strict FIFO; nothing overtakes the first waiter.

The first waiter (by ticket) starts as soon as it fits, on best fit for one GPU (rule 2's
least left) or the lowest-indexed GPUs with its need free for whole GPUs; nothing behind it
starts before it, and a new arrival starts at once only when nobody waits. A simulator
baseline (:mod:`~hwpool._core._baseline`): it keeps rules 1 and 2, none of the others.
"""

from __future__ import annotations

from ._baseline import Baseline
from ._policy import Policy
from ._requests import Demand, Grant

__all__ = ["POLICY", "Fifo"]


class Fifo(Baseline):
    """Strict FIFO with best fit; see the module docstring."""

    def place(self, demand: Demand, *, arriving: bool) -> tuple[int, ...] | None:
        if arriving and self.order.queue:
            return None
        fitting = self.placement.fitting(demand)
        if len(fitting) < demand.count:
            return None
        if demand.count == 1 and not demand.whole:
            return self.placement.fit(demand, fitting, take=False)
        return tuple(fitting[: demand.count])

    def walk(self, now: float) -> list[Grant]:
        queue, grants = self.order.queue, []
        while queue:
            ticket = next(iter(queue))
            demand = queue[ticket]
            gpus = self.place(demand, arriving=False)
            if gpus is None:
                break
            self.unqueue(ticket)
            grants.append(self.granted(ticket, demand, gpus))
        return grants


POLICY: type[Policy] = Fifo
