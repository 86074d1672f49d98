"""Owner limits while requests wait (rule 11): what a request counts against its owner's
limits, and whether a limit holds it now.

:class:`OwnerHolds` answers, for a waiter or a new arrival, the :class:`LimitHold` that keeps
it from being granted (or None), counting what the owner holds and what its reserving
waiters keep room for. The policies ask it before they grant, reserve or choose a head;
admission (:mod:`~hwpool._core._admission`) asks it what a request would count. Rule kept:
11 (held waiters; the refusals are admission's).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Protocol

from ._books import Books
from ._fairshare import Usage
from ._limits import EPSILON, LimitHold, OwnerLimits
from ._requests import Demand, share


class Queued(Protocol):
    """What the holds read of the queue order (:class:`~hwpool._core._order.QueueOrder`)."""

    @property
    def queue(self) -> Mapping[int, Demand]:
        """The waiters by ticket."""


__all__ = ["OwnerHolds"]


class OwnerHolds:
    """Each owner's limits, and what holds a request under them (rule 11).

    ``order`` (the queue) and ``reserving`` (the tickets of the waiters that reserve now:
    they keep room in their owner's limits) are set by the face once those parts exist."""

    def __init__(
        self,
        books: Books,
        usage: Usage,
        limits: dict[Hashable, OwnerLimits],
        default: OwnerLimits | None,
    ) -> None:
        self.books = books
        self.usage = usage
        self.limits = limits
        self.default = default
        self.active = any(lim.active for lim in limits.values()) or (
            default is not None and default.active
        )
        self.order: Queued | None = None
        self.reserving: Callable[[], Iterable[int]] = tuple

    def limits_of(self, owner: Hashable) -> OwnerLimits | None:
        """``owner``'s limits, or None where it has none."""
        limits = self.limits.get(owner, self.default)
        return limits if limits is not None and limits.active else None

    def charge(self, demand: Demand) -> float:
        """The GPUs ``demand`` counts against its owner's ``gpus`` limit: the most it could
        count wherever it lands (``u`` units on a GPU of ``total`` count ``u / total``)."""
        if demand.whole or demand.count > 1:
            return float(demand.count)
        totals = self.books.totals
        if self.books.uniform:
            return demand.units / totals[0]
        if demand.relative:
            return max(share(demand.units, total) / total for total in totals)
        return max(demand.units / total for total in totals if total >= demand.units)

    def unit_charge(self, demand: Demand) -> int:
        """The units ``demand`` counts against its owner's ``units`` limit: the most it
        could hold wherever it lands (whole GPUs: the largest ones)."""
        if demand.whole or demand.count > 1:
            return sum(sorted(self.books.totals, reverse=True)[: demand.count])
        if demand.relative:
            return max(self.books.needs_of(demand))
        return demand.units

    def committed(self, owner: Hashable, ticket: int | None) -> tuple[float, int, int]:
        """The GPUs, grants and units ``owner`` holds, plus those its waiters that reserve
        (other than ``ticket``) keep room for: a waiter that reserves stays within limits."""
        assert self.order is not None
        usage, queue = self.usage, self.order.queue
        gpus, grants, units = usage.running(owner), usage.grants(owner), usage.units(owner)
        for other in self.reserving():
            if other != ticket and other in queue and queue[other].owner == owner:
                gpus += self.charge(queue[other])
                grants += 1
                units += self.unit_charge(queue[other])
        return gpus, grants, units

    def hold(self, ticket: int | None, demand: Demand) -> LimitHold | None:
        """Why ``demand`` (waiter ``ticket``, or a new arrival: None) may not be granted now
        under its owner's limits, or None if it may (rule 11)."""
        limits = self.limits_of(demand.owner)
        if limits is None or (
            limits.running is None and limits.gpus is None and limits.units is None
        ):
            return None
        gpus, grants, units = self.committed(demand.owner, ticket)
        if limits.running is not None and grants + 1 > limits.running:
            return LimitHold(demand.owner, "running", limits.running, grants, 1)
        if limits.gpus is not None:
            need = self.charge(demand)
            if gpus + need > limits.gpus + EPSILON:
                return LimitHold(demand.owner, "gpus", limits.gpus, gpus, need)
        if limits.units is not None:
            asks = self.unit_charge(demand)
            if units + asks > limits.units:
                return LimitHold(demand.owner, "units", limits.units, units, asks)
        return None

    def held_in_walk(
        self, ticket: int, demand: Demand, held: tuple[set[Hashable], set[Demand]]
    ) -> bool:
        """Whether a limit holds waiter ``ticket`` in a walk, remembering in ``held`` the
        owners at their ``running`` limit and the demands past another: what an owner holds
        and reserves only grows during a walk, so they stay held, and each further waiter
        of them costs a set lookup."""
        owners, demands = held
        if demand.owner in owners or demand in demands:
            return True
        hold = self.hold(ticket, demand)
        if hold is None:
            return False
        if hold.limit == "running":
            owners.add(demand.owner)
        else:
            demands.add(demand)
        return True
