"""The ``reserve-all`` policy: every waiter reserves, in queue order (rules 3, 4, 5, 10r).

Walking the queue in order, each waiter that cannot be granted reserves the most free GPUs no
earlier waiter reserves (:meth:`~hwpool._core._placement.Placement.reserve`); the first that
cannot get its full set stops all reservations behind it. A new arrival may take only GPUs
no waiter reserves, and reserves at the tail. Every release or cancellation walks the queue
again, and the walk stops as soon as nothing further back could fit on an unreserved GPU
(:mod:`~hwpool._core._ranking`). On GPUs of one size without limits, groups or memory groups
the walk is the fast path over a ranking of the GPUs; otherwise the plain walk, same rules.
Rules kept: 3, 4, 5, 10r (and 11-13 through the parts it asks).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable
from typing import ClassVar

from ._policy import Parts, Policy
from ._ranking import DemandIndex, Ranking, index_key
from ._requests import Demand, Grant, Head, make_grant

__all__ = ["POLICY", "ReserveAll"]

Seen = tuple[dict[int, int], dict[int, int]]
"""Demands a walk has passed: counts per single-GPU key, and per count of whole GPUs."""


class ReserveAll:
    """Every waiter reserves (rules 3-5); see the module docstring."""

    lazy_usage: ClassVar[bool] = False

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.books, self.order, self.placement = parts.books, parts.order, parts.placement
        self.holds = parts.holds
        self.fast = parts.fast
        self.finish = parts.order.usage.finish
        self.restored = parts.order.usage.start  # held from before: counted from now
        self.start_over()

    def start_over(self) -> None:
        self.reserved: dict[int, tuple[int, ...]] = {}
        self.fraction_index = DemandIndex()  # units of waiting single-GPU demands
        self.whole_index = DemandIndex()  # counts of waiting multi-GPU demands
        # What a new arrival at the tail of the queue sees; meaningful only while some wait.
        self.tail = Ranking(self.books.free)
        # The same for the plain walk: the GPUs no waiter reserves, and whether the tail
        # still reserves.
        self.open: list[int] = list(range(self.books.num_gpus))
        self.reserving_now = True

    @property
    def head(self) -> Head | None:
        return None

    def reservations(self) -> dict[int, tuple[int, ...]]:
        return dict(self.reserved)

    def reserving(self) -> Iterable[int]:
        return self.reserved

    # ----------------------------------------------------------------- new arrivals
    def take_new(self, demand: Demand) -> tuple[int, ...] | None:
        """Take capacity for a new arrival where it fits without jumping the queue, or None."""
        if not self.fast:
            holds = self.holds
            if holds.active and holds.hold(None, demand) is not None:
                return None
            queued = bool(self.order.queue)
            return self.placement.fit(demand, self.open if queued else None, take=True)
        if self.order.queue:
            return self.placement.take_in(self.tail, demand.count, demand.units)
        return self.placement.take_anywhere(demand)

    def grant_now(self, demand: Demand, now: float, hint: float | None) -> Grant | None:
        gpus = self.take_new(demand)
        if gpus is None:
            return None
        ticket = next(self.books.tickets)
        grant = make_grant((ticket, gpus, self.books.units_of(demand, gpus)))
        return self.order.accounted(grant, demand.owner)

    def would_wait(self, demand: Demand, now: float, hint: float | None) -> bool:
        gpus = self.take_new(demand)
        if gpus is None:
            return True
        self.books.give_back(demand, gpus)
        return False

    def submit(self, demand: Demand, now: float, hint: float | None) -> tuple[int, Grant | None]:
        if not self.fast:
            return self._submit_general(demand)
        order = self.order
        ticket = next(self.books.tickets)
        gpus = self.take_new(demand)
        if gpus is not None:
            return ticket, order.accounted(make_grant((ticket, gpus, demand.units)), demand.owner)
        if not order.queue:
            self.tail.reset()
        order.enqueue(ticket, demand)
        self._index_of(demand).add(self._key_of(demand))
        reserved = self.tail.reserve(demand.count)
        if reserved is not None:
            self.reserved[ticket] = reserved
        return ticket, None

    def _submit_general(self, demand: Demand) -> tuple[int, Grant | None]:
        books, order = self.books, self.order
        ticket = next(books.tickets)
        gpus = self.take_new(demand)
        if gpus is not None:
            grant = make_grant((ticket, gpus, books.units_of(demand, gpus)))
            return ticket, order.accounted(grant, demand.owner)
        if not order.queue:
            self.open = list(range(books.num_gpus))
            self.reserving_now = True
        order.enqueue(ticket, demand)
        self._index_of(demand).add(self._key_of(demand))
        if self.holds.active and self.holds.hold(ticket, demand) is not None:
            return ticket, None  # held by its owner's limit: it reserves nothing (rule 11)
        if self.reserving_now:
            chosen = self.placement.reserve(demand, self.open)
            if chosen is None:
                self.reserving_now = False
            else:
                self.reserved[ticket] = chosen
                if books.sibling_of:
                    books.close_siblings(self.open, chosen)
        return ticket, None

    # ----------------------------------------------------------------- books and queue
    def requeue(self, ticket: int, demand: Demand, hint: float | None) -> None:
        self._index_of(demand).add(self._key_of(demand))

    def cancel(self, ticket: int, now: float) -> list[Grant]:
        demand = self.order.unqueue(ticket)
        self._index_of(demand).remove(self._key_of(demand))
        return self.walk(now)

    def _index_of(self, demand: Demand) -> DemandIndex:
        return self.whole_index if demand.count > 1 or demand.whole else self.fraction_index

    def _key_of(self, demand: Demand) -> int:
        return index_key(demand, self.books.smallest)

    def _dequeued(self, grants: list[Grant]) -> list[Grant]:
        """Take the waiters a walk granted out of the queue and its index; return ``grants``
        (counted in usage here, unless limits counted each as it was made)."""
        order, limited = self.order, self.holds.active
        for grant in grants:
            done = order.unqueue(grant.ticket)
            self._index_of(done).remove(self._key_of(done))
            if not limited:
                order.accounted(grant, done.owner)
        return grants

    # ----------------------------------------------------------------- the walk (rule 5)
    def _could_serve_rest(self, ranking: Ranking, seen: Seen) -> bool:
        """Whether any waiter not yet visited could fit on the unreserved GPUs."""
        smallest = self.fraction_index.min_excluding(seen[0])
        if smallest is not None and ranking.top_free() >= smallest:
            return True
        fewest = self.whole_index.min_excluding(seen[1])
        return fewest is not None and ranking.full_count_at_least(fewest, self.books.units_per_gpu)

    def _tally(self, seen: Seen, demand: Demand) -> None:
        if demand.count > 1 or demand.whole:
            counts, key = seen[1], demand.count
        else:
            counts, key = seen[0], self._key_of(demand) if demand.relative else demand.units
        counts[key] = counts.get(key, 0) + 1

    def _seen_upto(self, visited: int) -> Seen:
        """The demands of the first ``visited`` waiters, tallied for the early stop."""
        seen: Seen = ({}, {})
        for _, passed in itertools.islice(self.order.in_order(), visited):
            self._tally(seen, passed)
        return seen

    def walk(self, now: float) -> list[Grant]:
        """Recompute reservations in queue order and grant every waiter that fits (rules 3-5).

        This runs on every release, so the common step (a single-GPU waiter that does not fit
        and reserves the next most-free GPU) is written out inline. Once reservations stop,
        the walk counts the demands it has passed, to stop when nothing further back can fit.
        """
        if not self.fast:
            return self._walk_general()
        reserved = self.reserved
        reserved.clear()
        grants: list[Grant] = []
        free = self.books.free
        ranking = self.tail  # rebuilt here, and left as what a new arrival sees
        ranking.reset()
        gpus = ranking.gpus
        n = self.books.num_gpus
        take_in = self.placement.take_in
        visited = 0
        seen: Seen | None = None
        p = 0  # ranking.p, kept in a local on the hot path
        for ticket, demand in self.order.in_order():
            if p == n:
                break
            if seen is not None:
                ranking.p = p
                if not self._could_serve_rest(ranking, seen):
                    break
                self._tally(seen, demand)
            visited += 1
            count, units = demand.count, demand.units
            if count == 1 and free[gpus[p]] < units:  # fits nowhere open
                if seen is None:  # still reserving: take the most free open GPU
                    reserved[ticket] = (gpus[p],)
                    p += 1
                continue
            ranking.p = p
            taken = take_in(ranking, count, units)
            if taken is not None:
                grants.append(make_grant((ticket, taken, units)))
                continue
            chosen = ranking.reserve(count)
            p = ranking.p
            if chosen is not None:
                reserved[ticket] = chosen
            elif seen is None:  # reservations stop here: count what the walk has passed
                seen = self._seen_upto(visited)
        ranking.p = p
        return self._dequeued(grants)

    def _could_serve_rest_general(self, open_gpus: list[int], seen: Seen) -> bool:
        """Whether any waiter not yet visited could fit on ``open_gpus``."""
        free, totals = self.books.free, self.books.totals
        # A relative demand's key is its need on the smallest GPU: a lower bound, so this
        # may walk on where nothing fits, but never stops where something would.
        smallest = self.fraction_index.min_excluding(seen[0])
        if smallest is not None and any(free[gpu] >= smallest for gpu in open_gpus):
            return True
        fewest = self.whole_index.min_excluding(seen[1])
        idle = sum(1 for gpu in open_gpus if free[gpu] == totals[gpu])
        return fewest is not None and idle >= fewest

    def _walk_general(self) -> list[Grant]:
        """Rules 3-5 on GPUs of different sizes, with the same early stop as the fast walk."""
        books, placement, order, free = self.books, self.placement, self.order, self.books.free
        reserved = self.reserved
        reserved.clear()
        grants: list[Grant] = []
        open_gpus = list(range(books.num_gpus))
        reserving = True
        seen: Seen | None = None
        visited = 0
        limited = self.holds.active
        held: tuple[set[Hashable], set[Demand]] = (set(), set())  # owners, demands held
        for ticket, demand in order.in_order():
            if not open_gpus:
                break
            visited += 1
            if seen is not None:
                if not self._could_serve_rest_general(open_gpus, seen):
                    break
                self._tally(seen, demand)
            if limited and self.holds.held_in_walk(ticket, demand, held):
                continue  # held by its owner's limit: neither granted nor reserving (rule 11)
            if demand.count == 1 and not demand.whole and not limited:  # one pass (see below)
                fit, most, units = placement.single_pass(demand, open_gpus)
                if fit >= 0:
                    free[fit] -= units
                    grants.append(make_grant((ticket, (fit,), units)))
                    continue
                if reserving:
                    if most >= 0:
                        open_gpus.remove(most)
                        reserved[ticket] = (most,)
                        if books.sibling_of:
                            books.close_siblings(open_gpus, (most,))
                        continue
                    reserving, seen = False, self._seen_upto(visited)
                continue
            taken = placement.fit(demand, open_gpus, take=True)
            if taken is not None:
                grants.append(make_grant((ticket, taken, books.units_of(demand, taken))))
                if limited:  # counted now: the next waiter's limit reads it
                    order.accounted(grants[-1], demand.owner)
                continue
            if reserving:
                chosen = placement.reserve(demand, open_gpus)
                if chosen is not None:
                    reserved[ticket] = chosen
                    if books.sibling_of:
                        books.close_siblings(open_gpus, chosen)
                    continue
                reserving, seen = False, self._seen_upto(visited)
        self.open, self.reserving_now = open_gpus, reserving
        return self._dequeued(grants)


POLICY: type[Policy] = ReserveAll
