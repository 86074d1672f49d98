"""Queue order: who waits, and in which order (rules 8-10).

:class:`QueueOrder` keeps the waiting requests (FIFO by ticket), each owner's waiters by
priority (:class:`~hwpool._core._fairshare.OwnerQueue`), owners' usage
(:class:`~hwpool._core._fairshare.Usage`) and, with limits, what each owner has waiting. It
answers the queue order (owners by usage per share, least first; within an owner, higher
priority first, FIFO within a priority; plain FIFO while one owner at one priority waits) and
the first waiter. The policies walk this order; they never sort the queue themselves.
Rules kept: 8 (usage), 9 (order between owners), 10 (order within an owner).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator

from ._books import Books
from ._durations import Durations
from ._fairshare import OwnerQueue, Usage
from ._holds import OwnerHolds
from ._requests import Demand, Grant

__all__ = ["QueueOrder"]


class QueueOrder:
    """The queue, each owner's waiters, usage, and the order they make (rules 8-10).

    ``counting``: whether usage is counted yet (rule 8: under ``easy`` only once a demand
    names an owner or a priority, or limits read it)."""

    def __init__(
        self, books: Books, usage: Usage, durations: Durations, holds: OwnerHolds, counting: bool
    ) -> None:
        self.books = books
        self.usage = usage
        self.durations = durations
        self.holds = holds
        self.counting = counting
        self.queued = 0  # counts every change to the queue (see ranked)
        self.queue: OrderedDict[int, Demand] = OrderedDict()
        self.reset()

    def reset(self) -> None:
        """Nobody waits: an empty queue, no owner queues, FIFO order. Usage is kept."""
        self.queue = OrderedDict()
        self.owner_queues: dict[Hashable, OwnerQueue] = {}
        self.fair = False
        # The owners ranked (rule 9) at (now, self.queued): usage at one ``now`` does not
        # change with grants or releases made at it, so only time and the queue matter.
        self.queued += 1
        self.ranked_at: tuple[float, int] = (-math.inf, -1)
        self.ranked_owners: list[tuple[Hashable, OwnerQueue]] = []
        # Rule 11 (only with limits): per owner, its waiters and the GPUs and units they ask
        # at most.
        self.waiting_of: dict[Hashable, list[float]] = {}

    def enqueue(self, ticket: int, demand: Demand) -> None:
        """Put a waiter at the end of its owner's queue at its priority."""
        self.queue[ticket] = demand
        self.queued += 1
        holds = self.holds
        if holds.active:
            tally = self.waiting_of.setdefault(demand.owner, [0.0, 0.0, 0.0])
            tally[0] += 1
            tally[1] += holds.charge(demand)
            tally[2] += holds.unit_charge(demand)
        queues = self.owner_queues
        queue = queues.get(demand.owner)
        if queue is None:
            queue = queues[demand.owner] = OwnerQueue()
        queue.add(ticket, demand.priority)
        self.fair = len(queues) > 1 or len(queue.priorities) > 1

    def unqueue(self, ticket: int) -> Demand:
        """Take a waiter out of the queue and its owner's queue; return its demand."""
        demand = self.queue.pop(ticket)
        self.queued += 1
        holds = self.holds
        if holds.active:
            tally = self.waiting_of[demand.owner]
            tally[0] -= 1
            tally[1] -= holds.charge(demand)
            tally[2] -= holds.unit_charge(demand)
            if not tally[0]:
                del self.waiting_of[demand.owner]
        queues = self.owner_queues
        queue = queues[demand.owner]
        queue.remove(ticket, demand.priority)
        if not queue.priorities:
            del queues[demand.owner]
        if self.fair:
            self.fair = len(queues) > 1 or any(len(q.priorities) > 1 for q in queues.values())
        return demand

    def count_usage(self) -> None:
        """Count usage from now on, if not yet (rule 8: under ``easy`` only once a demand
        names an owner or a priority, or usage is asked for: until then all is one owner's,
        whose usage orders nothing, and a grant costs no bookkeeping). The grants running
        then count from their start; those that ended before are not counted."""
        if not self.counting:
            self.counting = True
            self.durations.count_running(self.usage.hold_since, self.books.now)

    def accounted(self, grant: Grant, owner: Hashable) -> Grant:
        """``grant`` of ``owner``, counted in its usage from now (rule 8)."""
        self.usage.start(grant.ticket, owner, self.books.held(grant), self.books.now)
        return grant

    def ranked(self) -> list[tuple[Hashable, OwnerQueue]]:
        """The owners with waiters, fairest first (rule 9): least usage per share at the
        latest ``now``, ties to the owner whose earliest waiter came first."""
        now = self.books.now
        if self.ranked_at == (now, self.queued):  # nothing that ranks has changed
            return self.ranked_owners
        ratio = self.usage.ratio
        keyed = sorted(
            (ratio(owner, now), queue.earliest(), owner)
            for owner, queue in self.owner_queues.items()
        )
        self.ranked_owners = [(owner, self.owner_queues[owner]) for _, _, owner in keyed]
        self.ranked_at = (now, self.queued)
        return self.ranked_owners

    def in_order(self) -> Iterable[tuple[int, Demand]]:
        """The waiters in queue order (rule 9): FIFO while one owner at one priority waits."""
        if not self.fair:
            return self.queue.items()
        return self._fair_items(self.ranked())

    def _fair_items(
        self, ranked: list[tuple[Hashable, OwnerQueue]]
    ) -> Iterator[tuple[int, Demand]]:
        queue = self.queue
        for _, owner_queue in ranked:
            for ticket in owner_queue:
                yield ticket, queue[ticket]

    def first(self) -> int:
        """The first waiter in queue order (the queue is not empty)."""
        if not self.fair:
            return next(iter(self.queue))
        return self.ranked()[0][1].first()
