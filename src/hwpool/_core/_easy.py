"""The ``easy`` policy: EASY backfilling, with hold times learned from what the core sees
(rules 3e-7e, 10e).

Waiters form one queue in the order of :mod:`~hwpool._core._order`; only its head reserves
(:mod:`~hwpool._core._easy_head`), and everything else may start at once where it cannot
delay the head (:mod:`~hwpool._core._easy_backfill`). The head is granted as soon as it fits
anywhere; a head whose shadow has passed may move once; a head yields once to a waiter of an
owner with less usage per share. With limits, the head is the first waiter its owner's limit
does not hold. Waiters are kept per demand (FIFO within each), which the backfill and the
size index walk. Rules kept: 5e (grant from the front), 6e (the bound that follows), 7e
(what is learned: each grant's hold time, through
:class:`~hwpool._core._durations.Durations`), 10e (the head's place among owners).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import ClassVar

from ._easy_backfill import Backfill
from ._easy_head import choose_head, drain
from ._policy import Parts, Policy
from ._requests import Demand, Grant, Head, class_of, make_grant
from ._sizes import SizeIndex

__all__ = ["POLICY", "Easy"]


class Easy:
    """EASY backfilling (rules 3e-7e, 10e); see the module docstring."""

    lazy_usage: ClassVar[bool] = True

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.books, self.order, self.holds = parts.books, parts.order, parts.holds
        self.placement, self.durations = parts.placement, parts.durations
        self.fast = parts.fast
        self.finish = parts.durations.finish
        # For the hot path (a grant when nobody waits): what never changes, bound once.
        self.tickets, self.usage = parts.books.tickets, parts.order.usage
        self.take_anywhere = parts.placement.take_anywhere
        self.backfill = Backfill(self)
        self.start_over()

    def start_over(self) -> None:
        # The head, the waiters per demand (FIFO within each; a demand includes its owner,
        # priority and limit), and the hints of those that gave one.
        self.head: Head | None = None
        self.classes: dict[Demand, OrderedDict[int, None]] = {}
        self.hints: dict[int, float] = {}
        # The classes that fit by their units alone (see by_size), by size with their
        # first waiter; the other classes by demand.
        self.sizes = SizeIndex(self.books.units_per_gpu)
        self.unsized: dict[Demand, OrderedDict[int, None]] = {}
        # Rule 10e: the head that yielded its place, until it is head again, and the
        # waiters that have yielded once (they never yield again).
        self.resume: int | None = None
        self.yielded: set[int] = set()
        self.backfill.start_over()

    def reservations(self) -> dict[int, tuple[int, ...]]:
        return {} if self.head is None else {self.head.ticket: self.head.gpus}

    def reserving(self) -> Iterable[int]:
        head = self.head
        return () if head is None else (head.ticket,)

    # ----------------------------------------------------------------- new arrivals
    def grant_now(self, demand: Demand, now: float, hint: float | None) -> Grant | None:
        if self.order.queue or not self.fast or hint is not None:
            gpus = self.place_new(demand, hint, now)
            if gpus is None:
                return None
            return self.start(next(self.books.tickets), demand, gpus, now, hint)
        gpus = self.take_anywhere(demand)  # nobody waits: the fast path, inline
        if gpus is None:
            return None
        ticket, units = next(self.tickets), demand.units
        key = (demand.count, units, False)  # class_of(demand), inline
        held = dict.fromkeys(gpus, units)
        account = self.usage.hold(demand.owner, held, now) if self.order.counting else None
        self.durations.start(ticket, key, held, now, None, account, demand.limit)
        return make_grant((ticket, gpus, units))

    def would_wait(self, demand: Demand, now: float, hint: float | None) -> bool:
        gpus = self.place_new(demand, hint, now)
        if gpus is None:
            return True
        self.books.give_back(demand, gpus)
        return False

    def submit(self, demand: Demand, now: float, hint: float | None) -> tuple[int, Grant | None]:
        gpus = self.place_new(demand, hint, now)
        ticket = next(self.books.tickets)
        if gpus is not None:
            return ticket, self.start(ticket, demand, gpus, now, hint)
        self.order.enqueue(ticket, demand)
        self.requeue(ticket, demand, hint)
        if self.head is None:  # the queue was empty, or every other waiter is held
            if not self.holds.active or self.holds.hold(ticket, demand) is None:
                self.head = self._choose(ticket, demand, now)
        elif self.order.fair:
            self.head = self._yield_head(self.head, now)
            if self.head.ticket == ticket:  # the head yielded to it (rule 10e): granted if it
                gpus = self.placement.fit(demand, None, take=True)  # fits (rule 5e)
                if gpus is not None:
                    self.dequeue(ticket)
                    grant = self.start(ticket, demand, gpus, now, hint)
                    first = self._next_head()  # the head it passed, head again
                    queue = self.order.queue
                    self.head = None if first is None else self._choose(first, queue[first], now)
                    return ticket, grant
        return ticket, None

    def place_new(self, demand: Demand, hint: float | None, now: float) -> tuple[int, ...] | None:
        """Take capacity for a new arrival: best fit anywhere if none wait, else a backfill
        (rule 4e), never ahead of an earlier waiter of its demand without a hint."""
        if self.holds.active and self.holds.hold(None, demand) is not None:
            return None  # held by its owner's limit (rule 11)
        if not self.order.queue:  # best fit over every GPU (the fast path on GPUs of one size)
            if self.fast:
                return self.placement.take_anywhere(demand)
            return self.placement.fit(demand, None, take=True)
        if demand in self.classes:
            return None  # an earlier one like it waits, and the same would stop it
        return self.backfill.fit(demand, now, hint)

    def start(
        self, ticket: int, demand: Demand, gpus: tuple[int, ...], now: float, hint: float | None
    ) -> Grant:
        """The grant of ``demand`` on ``gpus`` (taken already), its hold time now timed."""
        books, order = self.books, self.order
        units = books.units_of(demand, gpus) if demand.whole or demand.relative else demand.units
        grant = make_grant((ticket, gpus, units))
        if len(gpus) == 1 and units:
            held = {gpus[0]: units}
        else:
            held = dict.fromkeys(gpus, units) if units else {g: books.totals[g] for g in gpus}
        account = order.usage.hold(demand.owner, held, now) if order.counting else None
        self.durations.start(ticket, class_of(demand), held, now, hint, account, demand.limit)
        return grant

    # ----------------------------------------------------------------- books and queue
    def restored(
        self, ticket: int, owner: Hashable, parts: tuple[tuple[int, int], ...], now: float
    ) -> None:
        order = self.order
        held = dict(parts)
        account = order.usage.hold(owner, held, now) if order.counting else None
        self.durations.start(ticket, None, held, now, None, account)

    def requeue(self, ticket: int, demand: Demand, hint: float | None) -> None:
        """Put a waiter at the end of its demand's class (and keep its hint)."""
        waiting = self.classes.get(demand)
        if waiting is None:
            waiting = self.classes[demand] = OrderedDict()
            if not self.by_size(demand):
                self.unsized[demand] = waiting
        waiting[ticket] = None
        if hint is not None:
            self.hints[ticket] = hint
        if len(waiting) == 1 and demand not in self.unsized:
            self.sizes.set(demand.units, demand, ticket)

    def dequeue(self, ticket: int) -> Demand:
        """Take a waiter out of the queue and out of its class (O(1) wherever it is)."""
        demand = self.order.unqueue(ticket)
        if self.yielded:
            self.yielded.discard(ticket)
        if self.hints:
            self.hints.pop(ticket, None)
        waiting = self.classes[demand]
        sized = demand not in self.unsized
        first = sized and ticket == next(iter(waiting))
        del waiting[ticket]
        if first:  # the index holds each class's first waiter
            self.sizes.set(demand.units, demand, next(iter(waiting), None))
        if not waiting:
            del self.classes[demand]
            if not sized:
                del self.unsized[demand]
        return demand

    def by_size(self, demand: Demand) -> bool:
        """Whether ``demand`` fits during a walk by its units alone: a fractional demand
        without an enforced limit on GPUs of one size (rule 4e lets it onto the GPUs that
        have its units free, and onto a fractional head's GPU by what stays free for the
        head). Its class is then kept in the size index."""
        return (
            self.books.uniform
            and not self.parts.estimates
            and demand.count == 1
            and not demand.whole
            and not demand.relative
            and demand.limit is None
        )

    def cancel(self, ticket: int, now: float) -> list[Grant]:
        self.dequeue(ticket)
        if self.head is not None and self.head.ticket == ticket:
            self.head = None
        return self.walk(now)

    # ----------------------------------------------------------------- the walk (rule 5e)
    def _choose(self, ticket: int, demand: Demand, now: float, *, moved: bool = False) -> Head:
        return choose_head(self.books, self.durations, ticket, demand, now, moved=moved)

    def walk(self, now: float) -> list[Grant]:
        """Grant from the front while the first waiter fits anywhere (rule 5e), settle the
        head (rule 3e), then backfill behind it (rule 4e)."""
        grants: list[Grant] = []
        head = self.head
        queue = self.order.queue
        while True:
            head = self._grant_from_front(head, now, grants)
            if not queue:
                self.head = None
                return grants
            kept = head
            if head is None:
                first = self._next_head()
                if first is None:  # every waiter is held by its owner's limit (rule 11)
                    self.head = None
                    return grants
                head = self._choose(first, queue[first], now)
            if not self.order.fair:
                break
            yielded = self._yield_head(head, now)
            if (
                yielded is head
                or self.placement.fit(queue[yielded.ticket], None, take=False) is None
            ):
                head = yielded
                break
            head = yielded  # the head rule 10e chose fits now: granted (rule 5e), and again
        if head is kept and now >= head.shadow and not head.moved:  # overdue: move once
            ticket, demand = head.ticket, queue[head.ticket]
            better = self._choose(ticket, demand, now, moved=True)
            if better.gpus != head.gpus and better.shadow < drain(
                self.books, self.durations, head, demand, now
            ):
                head = better._replace(since=head.since)
        self.head = head
        self.backfill.run(head, now, grants)
        return grants

    def _grant_from_front(self, head: Head | None, now: float, grants: list[Grant]) -> Head | None:
        """Grant the head, then each next head, while it fits anywhere (rule 5e); the head
        left (None: choose one)."""
        order, holds = self.order, self.holds
        queue = order.queue
        limited = holds.active
        fifo = not order.fair and self.resume is None and not limited
        while queue:  # the head, else the next head (rule 10e; rule 11: not a held one)
            if head is not None:
                ticket = head.ticket
            else:
                first = next(iter(queue)) if fifo else self._next_head()
                if first is None:
                    break  # every waiter is held by its owner's limit
                ticket = first
            demand = queue[ticket]
            if limited and head is not None and holds.hold(ticket, demand) is not None:
                head = None  # its owner's limit holds it now: choose another
                continue
            gpus = self.placement.fit(demand, None, take=True)
            if gpus is None:
                break
            hint = self.hints.get(ticket) if self.hints else None
            self.dequeue(ticket)
            grants.append(self.start(ticket, demand, gpus, now, hint))
            head = None
        return head

    # ----------------------------------------------------------------- the head (rule 10e)
    def _next_head(self) -> int | None:
        """The waiter to become head (rule 10e): one that yielded its place, once the waiter
        it yielded to is gone, else the first in queue order; with limits, the first one its
        owner's limit does not hold (None if every waiter is held; rule 11)."""
        resume, holds = self.resume, self.holds
        if resume is not None:
            if resume not in self.order.queue:
                self.resume = None
            elif not holds.active or holds.hold(resume, self.order.queue[resume]) is None:
                return resume
        return self._first_eligible() if holds.active else self.order.first()

    def _yield_head(self, head: Head, now: float) -> Head:
        """``head``, or the first waiter in queue order if ``head`` yields to it (rule 10e):
        only to a waiter of an owner with strictly less usage per share, only while no other
        head has yielded, and only once in a head's wait."""
        if head.ticket == self.resume:
            self.resume = None  # head again: the yield is over
        queue = self.order.queue
        if (self.resume is not None and self.resume in queue) or (head.ticket in self.yielded):
            return head
        first = self._first_eligible() if self.holds.active else self.order.first()
        if first is None or first == head.ticket:
            return head
        ratio = self.order.usage.ratio
        if ratio(queue[first].owner, now) >= ratio(queue[head.ticket].owner, now):
            return head  # the same owner (a priority), or a tie: the head keeps its place
        self.yielded.add(head.ticket)
        self.resume = head.ticket
        return self._choose(first, queue[first], now)

    def _first_eligible(self) -> int | None:
        """The first waiter in queue order that no limit holds, or None (rule 11)."""
        order, holds = self.order, self.holds
        ranked = order.ranked() if order.fair else list(order.owner_queues.items())
        firsts: dict[Hashable, tuple[int, int]] | None = None
        for owner, owner_queue in ranked:
            if holds.limits_of(owner) is None:
                return owner_queue.first()
            if firsts is None:
                firsts = self._first_eligible_per_owner()
            first = firsts.get(owner)
            if first is not None:
                return first[1]
        return None

    def _first_eligible_per_owner(self) -> dict[Hashable, tuple[int, int]]:
        """Per owner with limits, ``(-priority, ticket)`` of its first waiter that no limit
        holds (rule 10's order within an owner), judged per demand by its earliest waiter:
        every waiter of one demand asks the same of the same owner, so one decides for all
        (O(demands), whatever the queue's length)."""
        holds = self.holds
        firsts: dict[Hashable, tuple[int, int]] = {}
        for demand, tickets in self.classes.items():
            owner = demand.owner
            ticket = next(iter(tickets))
            key = (-demand.priority, ticket)
            known = firsts.get(owner)
            if (
                (known is None or key < known)
                and holds.limits_of(owner) is not None
                and holds.hold(ticket, demand) is None
            ):
                firsts[owner] = key
        return firsts


POLICY: type[Policy] = Easy
