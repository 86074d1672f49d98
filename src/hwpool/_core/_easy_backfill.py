"""Backfill behind the ``easy`` head: who may start now without delaying it (rules 4e, 5e,
13).

A waiter behind the head, or a new arrival, may take the GPUs the head does not reserve
(nor, with memory groups, the other GPUs of the head's groups), and the head's own GPUs only
before its shadow and only if it surely cannot delay the head: its enforced limit ends by the
shadow, or (a fractional head and demand) it leaves the head's need free at the shadow
counting only grants whose limits end by then. Under ``backfill="estimates"`` expected holds
count as limits do. The walk offers one waiter per demand (a refused one refuses its whole
demand); on GPUs of one size in FIFO order, fractional demands without a limit are found
through the size index, so its cost does not grow with the distinct sizes waiting.
Rules kept: 4e, 5e (the backfill's order and its index), 13 (the head's memory groups).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Protocol

from ._policy import Parts
from ._ranking import index_key
from ._requests import Demand, Grant, Head, class_of
from ._sizes import SizeIndex

__all__ = ["Backfill", "Behind"]


class Behind(Protocol):
    """What the backfill reads and calls of its policy (:class:`~hwpool._core._easy.Easy`):
    the head, the waiters per demand, and how a waiter is granted and taken out."""

    parts: Parts
    hints: dict[int, float]
    sizes: SizeIndex

    @property
    def head(self) -> Head | None:
        """The head of the queue, or None."""

    @property
    def classes(self) -> dict[Demand, OrderedDict[int, None]]:
        """The waiters per demand, FIFO within each."""

    @property
    def unsized(self) -> dict[Demand, OrderedDict[int, None]]:
        """The classes not kept in the size index."""

    def start(
        self, ticket: int, demand: Demand, gpus: tuple[int, ...], now: float, hint: float | None
    ) -> Grant:
        """The grant of ``demand`` on ``gpus`` (taken already)."""

    def dequeue(self, ticket: int) -> Demand:
        """Take a waiter out of the queue and its class."""


class Backfill:
    """The backfill of one ``easy`` policy, over its waiters per demand."""

    def __init__(self, easy: Behind) -> None:
        self.easy = easy
        parts = easy.parts
        self.books, self.order, self.holds = parts.books, parts.order, parts.holds
        self.durations, self.placement = parts.durations, parts.placement
        self.estimates, self.fast = parts.estimates, parts.fast
        self.start_over()

    def start_over(self) -> None:
        self.open_of: Head | None = None  # the head self.open_gpus was made for
        self.open_gpus: list[int] = []

    def open_for(self, head: Head) -> list[int]:
        """The GPUs ``head`` does not reserve, kept per head: neither its GPUs nor, with
        memory groups, the other GPUs of their groups (rule 13)."""
        if self.open_of is not head:
            self.open_of = head
            closed = set(head.gpus)
            sibling_of = self.books.sibling_of
            for gpu in head.gpus:
                closed.update(sibling_of.get(gpu, ()))
            self.open_gpus = [gpu for gpu in range(self.books.num_gpus) if gpu not in closed]
        return self.open_gpus

    def fit(self, demand: Demand, now: float, hint: float | None) -> tuple[int, ...] | None:
        """Best fit for a request behind the head, taken, on the GPUs rule 4e lets it use: on
        the head's GPUs only what is sure not to delay it, by enforced limits alone (or,
        under ``backfill="estimates"``, what is expected not to)."""
        head = self.easy.head
        if head is None:
            return self.placement.fit(demand, None, take=True)
        allowed = self.open_for(head)
        if now < head.shadow:
            books, durations, estimates = self.books, self.durations, self.estimates
            limit = demand.limit
            if estimates:
                guess = durations.guess(class_of(demand), hint)
                if guess is not None and (limit is None or guess < limit):
                    limit = guess
            ends_in_time = limit is not None and now + limit <= head.shadow
            head_demand = self.order.queue[head.ticket]
            slack = (
                not (demand.whole or demand.count > 1)
                and head_demand.count == 1
                and not head_demand.whole
            )
            if ends_in_time or slack:
                allowed = list(allowed)
                if ends_in_time and books.sibling_of:  # rule 13: the head's memory groups
                    allowed += {
                        other
                        for gpu in head.gpus
                        for other in books.sibling_of.get(gpu, ())
                        if other not in head.gpus
                    }
                free, need = books.free, books.need
                for gpu in head.gpus:
                    if ends_in_time or (
                        durations.free_by(gpu, free[gpu], head.shadow, now, estimates)
                        - need(demand, gpu)
                        >= need(head_demand, gpu)
                    ):
                        allowed.append(gpu)
                allowed.sort()
        return self.placement.fit(demand, allowed, take=True)

    def run(self, head: Head, now: float, grants: list[Grant]) -> None:
        """Offer capacity to the waiters behind ``head`` in queue order (rule 4e).

        Waiters are taken per demand (its size, owner, priority and limit), the earliest of
        each first: once one is refused, the rest of its demand would be too (capacity only
        falls during the walk), so each walk looks at one waiter per demand plus those
        granted. The streams merge on the ticket, or, when owners or priorities differ, on
        (the owner's rank, minus the priority, the ticket): the queue order of rule 9.
        """
        easy, order, books, free = self.easy, self.order, self.books, self.books.free
        top = max(free)
        if top == 0:
            return
        fair = order.fair
        if not fair and self.fast and not self.estimates:
            self._run_by_size(head, now, grants, top)
            return
        idle = books.idle_count()
        # Only demands that could fit somewhere now: the others wait whatever the rules say.
        # (A relative demand is judged by its need on the smallest GPU: a lower bound.)
        rank = {owner: i for i, (owner, _) in enumerate(order.ranked())} if fair else {}
        smallest = books.smallest
        streams: list[Iterator[Any]] = [
            (iter(waiting) if not fair else _keyed(waiting, rank[demand.owner], -demand.priority))
            for demand, waiting in easy.classes.items()
            if (
                demand.count <= idle
                if demand.whole or demand.count > 1
                else index_key(demand, smallest) <= top
            )
        ]
        heap: list[tuple[Any, int]] = []
        for index, stream in enumerate(streams):
            key = next(stream, None)
            if key is not None and (key[2] if fair else key) == head.ticket:
                key = next(stream, None)
            if key is not None:
                heap.append((key, index))
        heapq.heapify(heap)
        granted: list[tuple[int, Demand]] = []
        # Sizes (with their limit) refused, whatever their owner (when fair).
        refused: set[Hashable] = set()
        hints = easy.hints
        limited = self.holds.active
        while heap and any(free):
            key, index = heap[0]
            ticket = key[2] if fair else key
            demand = order.queue[ticket]
            size = (class_of(demand), demand.limit) if fair else None
            if fair and size in refused:
                heapq.heappop(heap)  # another owner's waiter of this size was refused
                continue
            if limited and self.holds.hold(ticket, demand) is not None:
                heapq.heappop(heap)  # held by its owner's limit, and so is the rest of it
                continue
            hint = hints.get(ticket) if hints else None
            gpus = self.fit(demand, now, hint)
            if gpus is None:
                heapq.heappop(heap)  # the rest of this demand waits too
                if fair:
                    refused.add(size)
                continue
            grants.append(easy.start(ticket, demand, gpus, now, hint))
            granted.append((ticket, demand))
            following = next(streams[index], None)
            if following is not None and fair and following[2] == head.ticket:
                following = next(streams[index], None)  # the head, behind others in order
            if following is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (following, index))
        for ticket, _ in granted:
            easy.dequeue(ticket)

    def _run_by_size(self, head: Head, now: float, grants: list[Grant], top: int) -> None:
        """:meth:`run` in FIFO order on GPUs of one size, in O(log n) per grant.

        The same decisions: waiters in ticket order, one per demand until one is refused.
        A sized demand (see :meth:`~hwpool._core._easy.Easy.by_size`) fits iff its units are at most
        :meth:`_sized_room`, which only falls during the walk, so instead of offering every
        sized class its turn (and refusing most), the walk asks the size index for the
        earliest waiter among the classes that fit now; a class that would have been refused
        is never returned. Nor is the head (nor its class): it fits nowhere, or rule 5e
        would have granted it. The other demands (whole GPUs, enforced limits: a few)
        stream per class as in :meth:`run`, merged with it on the ticket.
        """
        easy = self.easy
        queue, free = self.order.queue, self.books.free
        idle = self.books.idle_count()
        streams: list[Iterator[int]] = [
            iter(waiting)
            for demand, waiting in easy.unsized.items()
            if (demand.count <= idle if demand.whole or demand.count > 1 else demand.units <= top)
        ]
        heap: list[tuple[int, int]] = []
        for index, stream in enumerate(streams):
            ticket = next(stream, None)
            if ticket == head.ticket:
                ticket = next(stream, None)
            if ticket is not None:
                heap.append((ticket, index))
        heapq.heapify(heap)
        granted: list[int] = []
        hints, sizes = easy.hints, easy.sizes
        while any(free):
            sized = sizes.earliest(self._sized_room(head, now))
            if heap and (sized is None or heap[0][0] < sized):
                ticket, index = heap[0]
                demand = queue[ticket]
                hint = hints.get(ticket) if hints else None
                gpus = self.fit(demand, now, hint)
                if gpus is None:
                    heapq.heappop(heap)  # the rest of this demand waits too
                    continue
                grants.append(easy.start(ticket, demand, gpus, now, hint))
                granted.append(ticket)
                following = next(streams[index], None)
                if following is None:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, (following, index))
                continue
            if sized is None:
                break
            demand = queue[sized]
            hint = hints.get(sized) if hints else None
            gpus = self.fit(demand, now, hint)
            assert gpus is not None, "a sized demand within the room fits"
            easy.dequeue(sized)  # its class is indexed under its next waiter
            grants.append(easy.start(sized, demand, gpus, now, hint))
        for ticket in granted:
            easy.dequeue(ticket)

    def _sized_room(self, head: Head, now: float) -> int:
        """The most units a sized demand may take now behind ``head``, by rule 4e: what is
        free on a GPU the head does not reserve, and, before the shadow of a fractional
        head, on the head's GPU what is free there and leaves the head its need at the
        shadow (by enforced limits alone)."""
        free = self.books.free
        room = max([free[gpu] for gpu in self.open_for(head)], default=0)
        if now < head.shadow:
            head_demand = self.order.queue[head.ticket]
            if head_demand.count == 1 and not head_demand.whole:
                need = self.books.need
                for gpu in head.gpus:
                    slack = self.durations.free_by(gpu, free[gpu], head.shadow, now, False)
                    room = max(room, min(free[gpu], slack - need(head_demand, gpu)))
        return room


def _keyed(tickets: Iterable[int], rank: int, priority: int) -> Iterator[tuple[int, int, int]]:
    """``tickets`` of one owner and priority as queue-order keys (rule 9)."""
    for ticket in tickets:
        yield rank, priority, ticket
