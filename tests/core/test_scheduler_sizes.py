"""The size index of the ``easy`` walk (issue 23: decisions in logarithmic time).

``SizeIndex`` against a plain model, and the core whose walk uses it against a reference
core whose walk is the one it replaced (copied below from the core as of commit 189c875,
where each walk offered every demand class its turn): the same grants, the same head, the
same free capacity after every input, whatever the mix of sizes, hints, limits, whole GPUs,
owners and priorities.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Hashable, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hwpool._core._easy import Easy
from hwpool._core._easy_backfill import Backfill, _keyed
from hwpool._core._ranking import index_key
from hwpool._core._requests import class_of
from hwpool._core._scheduler import Demand, Grant, Head, Scheduler
from hwpool._core._sizes import SizeIndex

U = 1_000


# ----------------------------------------------------------------- the index alone
@settings(max_examples=300, deadline=None)
@given(
    largest=st.sampled_from([1, 7, 1000, 63_000_000]),
    ops=st.lists(
        st.tuples(st.integers(0, 60), st.one_of(st.none(), st.integers(1, 10_000))),
        max_size=200,
    ),
    bounds=st.lists(st.integers(-1, 63_000_001), min_size=1, max_size=10),
)
def test_size_index_finds_the_smallest_ticket_within_a_bound(
    largest: int, ops: list[tuple[int, int | None]], bounds: list[int]
) -> None:
    """Classes set and taken out at random (crowded slots split; an emptied index starts
    over): ``earliest(bound)`` is the smallest ticket among sizes up to the bound."""
    index = SizeIndex(largest)
    model: dict[str, tuple[int, int]] = {}
    for n, ticket in ops:
        size = 1 + (n * 7919) % largest  # several classes per size, sizes spread
        cls = f"c{n}"
        if cls in model and model[cls][0] != size:
            continue
        index.set(size, cls, ticket)
        if ticket is None:
            model.pop(cls, None)
        else:
            model[cls] = (size, ticket)
        for bound in [*bounds, size, size - 1, largest]:
            fitting = [t for s, t in model.values() if s <= bound]
            assert index.earliest(bound) == (min(fitting) if fitting else None)
    assert len(index) == len(model)


def test_size_index_splits_crowded_slots_and_starts_over_small() -> None:
    index = SizeIndex(63_000_000)
    for i in range(5000):  # 5000 sizes in one narrow band: the slots split
        index.set(63_000_000 - i, i, 10_000 - i)
    assert index._bits > 10
    assert index.earliest(63_000_000 - 4000) == 10_000 - 4999
    assert index.earliest(63_000_000 - 5000) is None
    for i in range(5000):
        index.set(63_000_000 - i, i, None)
    assert len(index) == 0 and index._bits == 10
    assert index.earliest(63_000_000) is None


# ----------------------------------------------------------------- the walk
class ReferenceBackfill(Backfill):
    """The backfill as it was before the size index (every class offered)."""

    def run(self, head: Head, now: float, grants: list[Grant]) -> None:
        """Offer capacity to the waiters behind ``head`` in queue order (rule 4e).

        Waiters are taken per demand (its size, owner, priority and limit), the earliest of
        each first: once one is refused, the rest of its demand would be too (capacity only
        falls during the walk), so each walk looks at one waiter per demand plus those
        granted. The streams merge on the ticket, or, when owners or priorities differ, on
        (the owner's rank, minus the priority, the ticket): the queue order of rule 9.
        """
        easy, order = self.easy, self.order
        queue, free, totals = order.queue, self.books.free, self.books.totals
        top = max(free)
        if top == 0:
            return
        idle = sum(1 for gpu, f in enumerate(free) if f == totals[gpu])
        # Only demands that could fit somewhere now: the others wait whatever the rules say.
        # (A relative demand is judged by its need on the smallest GPU: a lower bound.)
        fair = order.fair
        rank = {owner: i for i, (owner, _) in enumerate(order.ranked())} if fair else {}
        streams: list[Iterator[Any]] = [
            (iter(waiting) if not fair else _keyed(waiting, rank[demand.owner], -demand.priority))
            for demand, waiting in easy.classes.items()
            if (
                demand.count <= idle
                if demand.whole or demand.count > 1
                else index_key(demand, self.books.smallest) <= top
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
        while heap and any(free):
            key, index = heap[0]
            ticket = key[2] if fair else key
            demand = queue[ticket]
            size = (class_of(demand), demand.limit) if fair else None
            if fair and size in refused:
                heapq.heappop(heap)  # another owner's waiter of this size was refused
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


def reference(totals: list[int]) -> Scheduler:
    """The core with the backfill it had before the size index."""
    core = Scheduler(totals)
    easy = core._policy
    assert isinstance(easy, Easy)
    easy.backfill = ReferenceBackfill(easy)
    return core


def _ops(rng: random.Random, owners: int, limits: float, n: int) -> Iterator[tuple[Any, ...]]:
    """``n`` random inputs: submits (80% fractional, mostly of distinct sizes; two whole
    GPUs; relative), releases and cancels, on a clock that moves forward."""
    for _ in range(n):
        draw = rng.random()
        if draw < 0.5:
            kind = rng.choice((0, 0, 0, 0, 0, 0, 0, 0, 1, 2))
            owner = rng.randrange(owners)
            priority = rng.choice((0, 0, 0, 1)) if owners > 1 else 0
            limit = rng.uniform(0.5, 30.0) if rng.random() < limits else None
            hint = rng.uniform(0.0, 30.0) if rng.random() < 0.3 else None
            demand = _demand(kind, rng.randint(50, U), owner, priority, limit)
            yield "submit", demand, hint, rng.uniform(0.0, 3.0)
        elif draw < 0.9:
            yield "release", rng.randrange(1 << 30), rng.uniform(0.0, 5.0)
        else:
            yield "cancel", rng.randrange(1 << 30), rng.uniform(0.0, 2.0)


def _demand(kind: int, units: int, owner: int, priority: int, limit: float | None) -> Demand:
    owner_key: Hashable = None if owner == 0 else f"o{owner}"
    if kind == 0:
        return Demand(1, units, owner=owner_key, priority=priority, limit=limit)
    if kind == 1:
        return Demand(2, U, owner=owner_key, priority=priority, limit=limit)
    return Demand(1, units, relative=True, owner=owner_key, priority=priority, limit=limit)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    totals=st.sampled_from([[U] * 3, [U] * 4, [U, U, 500]]),
    owners=st.sampled_from([1, 1, 2, 3]),
    limits=st.sampled_from([0.0, 0.3]),
)
def test_walk_by_size_decides_as_the_walk_it_replaced(
    seed: int, totals: list[int], owners: int, limits: float
) -> None:
    """Random submits (mostly distinct sizes; hints, limits, whole GPUs, relative demands,
    owners and priorities), releases and cancels on a moving clock: the core and the
    reference grant the same tickets on the same GPUs, with the same head and free units,
    after every input."""
    core, ref = Scheduler(list(totals)), reference(list(totals))
    held: dict[int, Grant] = {}
    waiting: list[int] = []
    now = 0.0

    def absorb(mine: list[Grant], theirs: list[Grant]) -> None:
        assert mine == theirs
        for grant in mine:
            held[grant.ticket] = grant
            waiting.remove(grant.ticket)

    for op in _ops(random.Random(seed), owners, limits, 150):
        now += op[-1]
        if op[0] == "submit":
            _, demand, hint, _ = op
            mine, theirs = (c.submit(demand, now=now, expected=hint) for c in (core, ref))
            assert mine == theirs
            ticket, grant = mine
            waiting.append(ticket)
            absorb([grant] if grant else [], [grant] if grant else [])
        elif op[0] == "release" and held:
            grant = held.pop(sorted(held)[op[1] % len(held)])
            absorb(
                core.release_many(core.held(grant), ticket=grant.ticket, now=now),
                ref.release_many(ref.held(grant), ticket=grant.ticket, now=now),
            )
        elif op[0] == "cancel" and waiting:
            ticket = waiting[op[1] % len(waiting)]
            waiting.remove(ticket)
            absorb(core.cancel(ticket, now=now), ref.cancel(ticket, now=now))
        assert core.free == ref.free
        assert core.head == ref.head
        assert [w.ticket for w in core.waiters()] == [w.ticket for w in ref.waiters()]


def test_a_walk_offers_nothing_to_sizes_that_cannot_fit(monkeypatch: Any) -> None:
    """500 waiters of distinct sizes that fit by size but not by rule 4e (a 4-GPU head
    reserves every GPU): a cancel from the middle of the queue offers capacity to none of
    them, where the walk it replaced offered it to each in turn (and refused it)."""
    core = Scheduler(4, U)
    for _ in range(4):
        core.submit(Demand(1, 900), now=0.0)
    core.submit(Demand(4, U), now=0.0)
    tickets = [
        core.submit(Demand(1, 1 + i % 100 + 100 * (i // 100)), now=0.0)[0] for i in range(500)
    ]
    assert core.queue_length == 501
    offered: list[int] = []
    fit = Backfill.fit

    def counted(
        self: Backfill, demand: Demand, now: float, hint: float | None
    ) -> tuple[int, ...] | None:
        offered.append(demand.units)
        return fit(self, demand, now, hint)

    monkeypatch.setattr(Backfill, "fit", counted)
    assert core.cancel(tickets[250], now=1.0) == []
    assert offered == []
