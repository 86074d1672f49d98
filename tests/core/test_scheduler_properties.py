"""Property tests of the scheduling core through its public face only (issue 37).

A hypothesis state machine drives :class:`~hwpool._core._scheduler.Scheduler` through random
submits and ``grant_now`` calls, releases (``release``, ``release_granted``, ``release_many``),
cancels, withholds, restores and rebuilds, under each policy (``easy`` with both backfills,
``reserve-all``), on GPUs of one size and of several, with and without groups (rule 12) and
memory groups (rule 13), with owners, priorities, owner limits (rule 11) and demand limits.
After every step it checks, from the public queries alone (the core is being split into parts,
and these tests must outlive that):

- the books: per GPU, what is free is its total less what grants and withholding hold (with a
  memory group, the least of that and the group's room), and no grant is placed on capacity
  that is not free;
- every ticket is exactly one of waiting, granted or gone, and a grant is what its demand asks
  (count, units or whole GPUs, a relative demand's share on the GPU it got), within one group;
- reservations: disjoint, on GPUs that could hold the waiter; under ``reserve-all`` held by
  a prefix of the queue order; under ``easy`` by the head alone, which keeps its GPUs and
  shadow until it is granted, cancelled or moves once after its shadow (rule 3e);
- nothing left waiting that the rules say must be granted (rules 4, 5, 4e, 5e), where the
  queue order makes that exact;
- rule 6e, where every demand carries an enforced limit: the head is granted by the time the
  grants running on its GPUs when it became head, and every grant placed there since, have
  ended (each released at its limit at the latest); under ``backfill="limits"`` by the later
  of its shadow and the end of the grants running there when it became head.

``TESTS_HWPOOL_LONG=1`` runs many more examples (see docs/environment.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._limits import OwnerLimits
from hwpool._core._scheduler import Demand, Grant, Head, Scheduler

U = 1_000
LONG = bool(os.environ.get("TESTS_HWPOOL_LONG"))
# A long run takes minutes per machine: past the suite's timeout of a minute a test.
pytestmark = [pytest.mark.timeout(3000)] if LONG else []

# The machines the core is built for: (totals, groups, memory_groups).
SHAPES: list[tuple[list[int], list[Hashable] | None, list[Hashable | None] | None]] = [
    ([U, U, U, U], None, None),
    ([U, U, U, U], ["m0", "m0", "m1", "m1"], None),
    ([U, U, U // 2, U // 4], None, None),
    ([U, U // 2, U, U // 2], [0, 0, 1, 1], None),
    ([U, U, U, U // 2], None, ["gi", "gi", None, None]),
    ([U, U, U, U], [0, 0, 1, 1], ["gi", "gi", None, None]),
]
OWNER_LIMITS = {
    "a": OwnerLimits(gpus=2.0, running=2),
    "b": OwnerLimits(units=U + U // 2, queued=3),
}
OWNERS = [None, "a", "b"]
DT = st.sampled_from([0.0, 0.0, 0.5, 2.0, 5.0])
FRACTIONS = st.sampled_from([1, 150, 250, 400, 500, 700, U])
SHARES = st.sampled_from([UNITS_PER_GPU // 4, UNITS_PER_GPU // 2, UNITS_PER_GPU])


def need(demand: Demand, total: int) -> int:
    """Units ``demand`` takes on a GPU of ``total`` units (rule 1)."""
    if demand.whole or demand.count > 1:
        return total
    if demand.relative:
        return max(1, -(-demand.units * total // UNITS_PER_GPU))
    return demand.units


@dataclass
class Live:
    """A grant the model holds: its demand (None: restored or rebuilt from books), when it
    started and the time by which the driver releases it (inf: no deadline)."""

    grant: Grant
    demand: Demand | None
    start: float
    deadline: float
    parts: tuple[tuple[int, int], ...] = ()


@dataclass
class Tracked:
    """The head as first seen (rule 6e's t0), with the grants on or beside its GPUs then and
    those placed there since (tickets)."""

    ticket: int
    gpus: tuple[int, ...]
    shadow: float
    since: float
    moved: bool
    t0: float
    at_t0: dict[int, float] = field(default_factory=dict)  # ticket -> deadline
    placed: dict[int, float] = field(default_factory=dict)


class CoreMachine(RuleBasedStateMachine):
    """The core under random use; the subclasses below fix the policy and whether every
    demand carries a limit (rule 6e's premise)."""

    POLICY: ClassVar[str] = "easy"
    BACKFILL: ClassVar[str] = "limits"
    BOUNDED: ClassVar[bool] = False  # every demand has a limit; no withholding

    def __init__(self) -> None:
        super().__init__()
        self.core: Scheduler | None = None
        self.now = 0.0
        self.live: dict[int, Live] = {}
        self.waiting: dict[int, tuple[Demand, float | None]] = {}
        self.gone: set[int] = set()
        self.seen: set[int] = set()
        self.step_grants: list[Grant] = []
        self.tracked: Tracked | None = None
        self.limited = False
        # A head chosen by rule 10e's yield in a submit, to an earlier waiter, and no walk
        # since: submit grants the arrival alone, so the waiter yielded to (if it fits) and
        # what the old head gave up wait for the next walk (docs/scheduling.md, rule 10e).
        self.yield_unwalked = False
        self.head_before: Head | None = None
        self.rebuilt = False

    # ------------------------------------------------------------- set-up
    @initialize(
        shape=st.sampled_from(range(len(SHAPES))),
        limited=st.booleans(),
        shares=st.booleans(),
    )
    def build(self, shape: int, limited: bool, shares: bool) -> None:
        totals, groups, memory = SHAPES[shape]
        self.limited = limited
        self.core = Scheduler(
            totals,
            policy=self.POLICY,
            backfill=self.BACKFILL,
            shares={"a": 2.0} if shares else None,
            half_life=60.0,
            limits=OWNER_LIMITS if limited else None,
            groups=groups,
            memory_groups=memory,
        )

    @property
    def c(self) -> Scheduler:
        assert self.core is not None
        return self.core

    # ------------------------------------------------------------- the clock
    def advance(self, dt: float, walks: bool = False) -> None:
        """Start a step (``walks``: one that walks the queue): move the clock on; where grants
        have deadlines, never past the first of them (the caller enforces limits: a grant
        has ended by then)."""
        self.step_grants = []
        self.head_before = self.c.head
        self.rebuilt = False
        if walks:
            self.yield_unwalked = False
        target = self.now + dt
        if self.BOUNDED and self.live:
            target = min(target, *(live.deadline for live in self.live.values()))
        self.now = max(self.now, target)

    # ------------------------------------------------------------- inputs
    @rule(
        kind=st.sampled_from(["fraction", "relative", "whole"]),
        units=FRACTIONS,
        share=SHARES,
        count=st.integers(1, 3),
        owner=st.sampled_from(OWNERS),
        priority=st.sampled_from([0, 0, 1]),
        limit=st.sampled_from([None, 1.0, 3.0, 10.0, 30.0]),
        hint=st.sampled_from([None, None, 1.0, 4.0]),
        dt=DT,
        at_once=st.booleans(),
    )
    def submit(  # noqa: PLR0917 (hypothesis passes each drawn value by name)
        self,
        kind: str,
        units: int,
        share: int,
        count: int,
        owner: Hashable,
        priority: int,
        limit: float | None,
        hint: float | None,
        dt: float,
        at_once: bool,
    ) -> None:
        if self.BOUNDED and limit is None:
            limit = 2.0
        if kind == "whole":
            demand = Demand(count, U, whole=True, owner=owner, priority=priority, limit=limit)
        elif kind == "relative":
            demand = Demand(1, share, relative=True, owner=owner, priority=priority, limit=limit)
        else:
            demand = Demand(1, units, owner=owner, priority=priority, limit=limit)
        self.advance(dt)
        before = self.snapshot()
        try:
            if at_once:
                grant = self.c.grant_now(demand, now=self.now, expected=hint)
                ticket = None if grant is None else grant.ticket
            else:
                ticket, grant = self.c.submit(demand, now=self.now, expected=hint)
        except ValueError:  # never fits, or refused by its owner's limits: nothing changed
            assert self.snapshot() == before
            return
        if ticket is None:
            assert self.snapshot() == before, "grant_now granted nothing but changed the state"
            return
        assert ticket not in self.seen, f"ticket {ticket} given twice"
        self.seen.add(ticket)
        self.waiting[ticket] = (demand, hint)
        self.absorb([grant] if grant is not None else [])
        if grant is None:
            assert not at_once
        elif self.POLICY == "easy":  # rule 4e: never past an earlier waiter of its demand
            assert demand not in [d for t, (d, _) in self.waiting.items() if t != ticket], (
                f"{grant} passed an earlier waiter of its own demand {demand}"
            )

    @precondition(lambda self: self.live and not self.BOUNDED)
    @rule(data=st.data(), how=st.sampled_from(["granted", "many", "each"]), dt=DT)
    def release(self, data: st.DataObject, how: str, dt: float) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.live)))
        self.advance(dt, walks=True)
        self.release_one(ticket, how)

    @precondition(lambda self: self.BOUNDED and bool(self.live))
    @rule(how=st.sampled_from(["granted", "many", "each"]), early=st.sampled_from([0, 0, 0.5]))
    def release_at_limit(self, how: str, early: float) -> None:
        """Time moves on to the first deadline (or a little before it), where that grant ends
        (rule 6e's driver: grants end by their limits)."""
        ticket = min(self.live, key=lambda t: (self.live[t].deadline, t))
        deadline = self.live[ticket].deadline
        self.advance(0.0, walks=True)
        if math.isfinite(deadline):
            self.now = max(self.now, deadline - early)
        self.release_one(ticket, how)

    def release_one(self, ticket: int, how: str) -> None:
        live = self.live.pop(ticket)
        self.gone.add(ticket)
        parts = self.parts_of(live)
        if how == "granted":
            grants = self.c.release_granted(live.grant, now=self.now)
        elif how == "each" and len(parts) == 1:
            ((gpu, units),) = parts
            grants = self.c.release(gpu, units, ticket=ticket, now=self.now)
        else:
            grants = self.c.release_many(parts, ticket=ticket, now=self.now)
        self.absorb(grants)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), dt=DT)
    def cancel(self, data: st.DataObject, dt: float) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        self.advance(dt, walks=True)
        del self.waiting[ticket]
        self.gone.add(ticket)
        self.absorb(self.c.cancel(ticket, now=self.now))

    @precondition(lambda self: not self.BOUNDED)
    @rule(gpu=st.integers(0, 3), fraction=st.sampled_from([0, 0, 0.1, 0.5, 1.0]), dt=DT)
    def withhold(self, gpu: int, fraction: float, dt: float) -> None:
        units = int(self.c.totals[gpu] * fraction)
        self.advance(dt, walks=units != self.c.withheld[gpu])  # a change walks the queue
        self.absorb(self.c.withhold(gpu, units, now=self.now))

    @precondition(lambda self: not self.waiting)
    @rule(
        gpus=st.sets(st.integers(0, 3), min_size=1, max_size=2),
        owner=st.sampled_from(OWNERS),
        back=st.sampled_from([None, 5.0]),
        dt=DT,
    )
    def restore(self, gpus: set[int], owner: Hashable, back: float | None, dt: float) -> None:
        """A grant held before a restart, taken back while nobody waits."""
        self.advance(dt)
        room = min(self.c.free[g] for g in gpus)
        if room < 1:
            return
        units = max(1, room // 2)
        try:
            self.c.check_restore(owner, dict.fromkeys(gpus, units))
        except ValueError:
            return
        over = any(
            gpus & set(memory) and used + units * len(gpus & set(memory)) > capacity
            for memory, capacity, used in self.c.memory_held()
        )
        if over:  # rule 13: more than one memory holds, refused, changing nothing
            before = (self.c.free, self.c.memory_held())
            with pytest.raises(ValueError, match="share one memory"):
                self.c.restore(tuple(sorted(gpus)), units, now=self.now, owner=owner)
            assert (self.c.free, self.c.memory_held()) == before
            return
        since = None if back is None else self.now - back
        grant = self.c.restore(tuple(sorted(gpus)), units, now=self.now, owner=owner, since=since)
        assert grant.ticket not in self.seen
        self.seen.add(grant.ticket)
        parts = tuple((gpu, units) for gpu in grant.gpus)
        assert self.c.held(grant) == parts
        self.live[grant.ticket] = Live(grant, None, self.now, self.now + 4.0, parts)

    @precondition(lambda self: (self.live or self.waiting) and not self.BOUNDED)
    @rule(dt=DT)
    def rebuild(self, dt: float) -> None:
        """Start over from the caller's books (what a front does after an interrupted call)."""
        self.advance(dt, walks=True)
        self.rebuilt = True
        held = [(t, self.parts_of(live)) for t, live in sorted(self.live.items())]
        waiting = [(t, demand, hint) for t, (demand, hint) in sorted(self.waiting.items())]
        self.tracked = None  # every head is chosen afresh
        self.absorb(self.c.rebuild(held, waiting, now=self.now))

    def parts_of(self, live: Live) -> tuple[tuple[int, int], ...]:
        return live.parts or self.c.held(live.grant)

    # ------------------------------------------------------------- the model
    def snapshot(self) -> tuple[Any, ...]:
        c = self.c
        return (
            c.free,
            c.withheld,
            c.memory_held(),
            c.queue_length,
            sorted((w.ticket, w.reserved) for w in c.waiters()),
            c.reservations(),
            c.head,
        )

    def absorb(self, grants: Iterable[Grant]) -> None:
        self.step_grants = list(grants)
        for grant in self.step_grants:
            assert grant.ticket in self.waiting, f"grant to ticket {grant.ticket}, not waiting"
            assert grant.ticket not in self.live and grant.ticket not in self.gone
            demand, _ = self.waiting.pop(grant.ticket)
            deadline = self.now + demand.limit if demand.limit is not None else math.inf
            self.live[grant.ticket] = Live(grant, demand, self.now, deadline)
            self.check_grant(grant, demand)

    # ------------------------------------------------------------- checks
    def group_of(self, gpu: int) -> int:
        return next(k for k, gpus in enumerate(self.c.groups) if gpu in gpus)

    def memory_of(self, gpu: int) -> tuple[int, ...]:
        """The GPUs sharing ``gpu``'s memory, itself included."""
        return next((gpus for gpus in self.c.memory_groups if gpu in gpus), (gpu,))

    def shares_memory(self, gpus: tuple[int, ...]) -> bool:
        """Whether two of ``gpus`` draw on one memory (whole GPUs of one grant never do)."""
        return len({self.memory_of(g) for g in gpus}) < len(gpus)

    def check_grant(self, grant: Grant, demand: Demand) -> None:
        """A grant is what its demand asks, on capacity that was free (rules 1, 12, 13)."""
        c = self.c
        gpus = grant.gpus
        assert len(gpus) == demand.count == len(set(gpus)), (grant, demand)
        assert all(0 <= g < c.num_gpus for g in gpus)
        held = dict(c.held(grant))
        for gpu in gpus:
            assert held[gpu] == need(demand, c.totals[gpu]), (grant, demand, c.totals)
        if len(gpus) > 1:
            assert len({self.group_of(g) for g in gpus}) == 1, "a grant across groups"
            assert len({self.memory_of(g) for g in gpus}) == len(gpus), "whole GPUs share memory"

    def granted_per_gpu(self) -> list[int]:
        granted = [0] * self.c.num_gpus
        for live in self.live.values():
            for gpu, units in self.parts_of(live):
                granted[gpu] += units
        return granted

    @invariant()
    def books_add_up(self) -> None:
        """Per GPU: free + granted + withheld == total (with a memory group, free is the
        least of that and the group's room), and grants never overlap beyond capacity."""
        if self.core is None:
            return
        c = self.c
        granted, withheld, totals = self.granted_per_gpu(), c.withheld, c.totals
        assert len(c.free) == len(totals) == len(withheld) == c.num_gpus
        rooms: dict[tuple[int, ...], int] = {}
        memory_held = {gpus: (capacity, used) for gpus, capacity, used in c.memory_held()}
        assert set(memory_held) == set(c.memory_groups)
        for gpus, (capacity, used) in memory_held.items():
            assert used == sum(granted[g] + withheld[g] for g in gpus), (gpus, used)
            assert sum(granted[g] for g in gpus) <= capacity, "a memory granted beyond it"
            assert capacity == totals[gpus[0]]
            rooms[gpus] = capacity - used
        for gpu, total in enumerate(totals):
            assert 0 <= withheld[gpu] <= total
            assert 0 <= granted[gpu] <= total, (gpu, granted, totals)
            own = total - granted[gpu] - withheld[gpu]
            shared = self.memory_of(gpu)
            expected = min(own, rooms[shared]) if len(shared) > 1 else own
            assert c.free[gpu] == expected, (gpu, c.free, granted, withheld)
        for grant in self.step_grants:  # placed only where it was free
            for gpu in grant.gpus:
                assert c.free[gpu] >= 0, (grant, c.free)
                demand = self.live[grant.ticket].demand
                if demand is not None and (demand.whole or demand.count > 1):  # idle GPU, memory
                    assert withheld[gpu] == 0 and granted[gpu] == totals[gpu]
                    assert all(granted[g] == 0 for g in self.memory_of(gpu) if g != gpu)

    @invariant()
    def every_ticket_in_one_place(self) -> None:
        if self.core is None:
            return
        c = self.c
        waiters = list(c.waiters())
        tickets = [w.ticket for w in waiters]
        assert len(tickets) == len(set(tickets)) == c.queue_length
        assert set(tickets) == set(self.waiting), (tickets, sorted(self.waiting))
        assert not set(self.waiting) & set(self.live)
        assert not (set(self.waiting) | set(self.live)) & self.gone
        assert set(self.waiting) | set(self.live) | self.gone == self.seen
        for ticket in self.seen:
            assert c.is_waiting(ticket) == (ticket in self.waiting)

    @invariant()
    def reservations_follow_the_rules(self) -> None:
        if self.core is None:
            return
        c = self.c
        waiters = list(c.waiters())
        reservations = c.reservations()
        by_ticket = {w.ticket: w for w in waiters}
        flat = [g for gpus in reservations.values() for g in gpus]
        assert len(flat) == len(set(flat)), f"reservations overlap: {reservations}"
        for ticket, gpus in reservations.items():
            waiter = by_ticket[ticket]  # only waiters reserve
            assert waiter.reserved == gpus and waiter.held is None
            demand = waiter.demand
            assert len(gpus) == demand.count == len(set(gpus)), (ticket, gpus, demand)
            assert all(c.totals[g] >= need(demand, c.totals[g]) for g in gpus)
            if not (demand.whole or demand.count > 1):
                assert all(demand.units <= c.totals[g] for g in gpus if not demand.relative)
            if len(gpus) > 1:
                assert len({self.group_of(g) for g in gpus}) == 1, "reserved across groups"
                if not self.shares_memory(gpus) or self.POLICY != "easy":
                    assert not self.shares_memory(gpus), f"{ticket} reserved one memory twice"
        for waiter in waiters:
            assert waiter.reserved == reservations.get(waiter.ticket, ())
        if self.POLICY == "easy":
            self.check_head(waiters, reservations)
        else:
            assert c.head is None
            self.check_reserve_all(waiters, reservations)

    def fifo(self, waiters: list[Any]) -> bool:
        """Whether the queue order is plain FIFO (one owner at one priority waits): where the
        order of rule 9 cannot have moved since the last walk."""
        return len({(w.demand.owner, w.demand.priority) for w in waiters}) <= 1

    def fits(self, demand: Demand, gpus: Iterable[int]) -> bool:
        """Whether ``demand`` fits now on ``gpus`` (rules 1, 12, 13)."""
        c = self.c
        allowed = sorted(set(gpus))
        if not (demand.whole or demand.count > 1):
            return any(c.free[g] >= need(demand, c.totals[g]) for g in allowed)
        idle = [g for g in allowed if c.free[g] == c.totals[g]]
        for group in c.groups if demand.count > 1 else (tuple(range(c.num_gpus)),):
            memories = {self.memory_of(g) for g in idle if g in group}
            if len(memories) >= demand.count:
                return True
        return False

    def check_reserve_all(self, waiters: list[Any], reservations: dict[int, Any]) -> None:
        """Rules 3-5: reservations closed to each other by memory group too; where the order
        is FIFO, held by a prefix of the waiters not held, and no waiter fits on the GPUs no
        earlier waiter reserves; otherwise none fits on the GPUs nobody reserves."""
        c = self.c
        closed: list[set[int]] = []
        for gpus in reservations.values():
            closed.append({m for g in gpus for m in self.memory_of(g)})
        for i, a in enumerate(closed):
            for b in closed[i + 1 :]:
                assert not a & b, f"reservations share a memory: {reservations}"
        everyone = set().union(*closed) if closed else set()
        for waiter in waiters:
            if waiter.held is None:
                open_gpus = [g for g in range(c.num_gpus) if g not in everyone]
                assert not self.fits(waiter.demand, open_gpus), f"{waiter} fits on {open_gpus}"
        if not self.fifo(waiters):
            return
        before: set[int] = set()
        stopped = False
        for waiter in waiters:
            if waiter.held is not None:
                continue
            mine = set(reservations.get(waiter.ticket, ()))
            assert not (stopped and mine), f"{waiter.ticket} reserves after the walk stopped"
            stopped = stopped or not mine
            open_gpus = [g for g in range(c.num_gpus) if g not in before]
            assert not self.fits(waiter.demand, open_gpus), f"{waiter} fits on {open_gpus}"
            before |= {m for g in mine for m in self.memory_of(g)}

    def check_head(self, waiters: list[Any], reservations: dict[int, Any]) -> None:
        """Rules 3e-5e, 10e, 11: the head alone reserves; it keeps its GPUs and shadow (but
        for one move after the shadow); it fits nowhere, and no other waiter fits on the
        GPUs it does not reserve."""
        c = self.c
        tracked = self.tracked
        if tracked is not None and tracked.ticket in {g.ticket for g in self.step_grants}:
            self.check_bound(tracked)  # granted now: by the bound
            self.tracked = None
        head = c.head
        if head is None:
            assert reservations == {}
            assert all(w.held is not None for w in waiters), "waiters but no head"
            self.tracked = None
            return
        assert reservations == {head.ticket: head.gpus}
        first = waiters[0]
        if not self.limited and self.fifo(waiters):
            assert head.ticket == first.ticket, "the head is not the first waiter"
        demand = next(w.demand for w in waiters if w.ticket == head.ticket)
        before = self.head_before
        if (
            before is not None
            and before.ticket != head.ticket
            and before.ticket in self.waiting
            and not self.rebuilt
        ):
            self.yield_unwalked = True  # the head yielded (rule 10e)
        if self.yield_unwalked:  # settled at the next walk (see the flag)
            self.tracked = None  # and rule 6e counted from the next walk
            return
        assert not self.shares_memory(head.gpus), f"the head {head} reserves one memory twice"
        assert not self.fits(demand, range(c.num_gpus)), f"the head {head} fits"
        closed = {m for g in head.gpus for m in self.memory_of(g)}
        open_gpus = [g for g in range(c.num_gpus) if g not in closed]
        if not self.limited or self.fifo(waiters):
            for waiter in waiters:
                if waiter.ticket != head.ticket and waiter.held is None:
                    assert not self.fits(waiter.demand, open_gpus), f"{waiter} fits"
        self.track_head(head)

    def track_head(self, head: Head) -> None:
        """The head keeps its reservation; rule 6e where every demand has a limit."""
        tracked = self.tracked
        if tracked is not None and tracked.ticket == head.ticket:
            if head.gpus == tracked.gpus:
                assert (head.shadow, head.since) == (tracked.shadow, tracked.since), head
                assert head.moved == tracked.moved, head
                self.check_placed(tracked)
                self.check_bound(tracked)
                return
            assert not tracked.moved and head.moved, f"the head hopped: {tracked} -> {head}"
            assert self.now >= tracked.shadow, "the head moved before its shadow"
            assert head.since == tracked.since
        self.tracked = tracked = Tracked(
            head.ticket, head.gpus, head.shadow, head.since, head.moved, self.now
        )
        for ticket, live in self.live.items():
            if self.on_head(live, tracked):
                tracked.at_t0[ticket] = live.deadline
        self.check_bound(tracked)

    def on_head(self, live: Live, tracked: Tracked) -> bool:
        near = {m for g in tracked.gpus for m in self.memory_of(g)}
        return any(g in near for g, _ in self.parts_of(live))

    def check_placed(self, tracked: Tracked) -> None:
        """Rule 4e: while it stays head, nothing new goes onto its GPUs (or, rule 13, beside
        them) from its shadow on."""
        for grant in self.step_grants:
            live = self.live.get(grant.ticket)
            if live is None or not self.on_head(live, tracked):
                continue
            assert self.now < tracked.shadow, (
                f"{grant} placed on the head's GPUs {tracked.gpus} at {self.now}, "
                f"at or after its shadow {tracked.shadow}"
            )
            tracked.placed[grant.ticket] = live.deadline

    def check_bound(self, tracked: Tracked) -> None:
        """Rule 6e: the head, waiting or granted at ``self.now``, is granted by the time every
        grant running on its GPUs when it became head, and every grant placed there since,
        has ended (the driver ends each by its limit at the latest); under ``limits``, by the
        later of its shadow and the end of those running there when it became head."""
        if not self.BOUNDED:
            return
        ends = [*tracked.at_t0.values(), *tracked.placed.values()]
        assert ends, f"the head {tracked} waits on GPUs where nothing runs"
        assert self.now <= max(ends), (
            f"the head {tracked} waits until {self.now}, after every grant on its GPUs "
            f"since it became head has ended (by {max(ends)})"
        )
        if self.BACKFILL == "limits":
            bound = max([tracked.shadow, *tracked.at_t0.values()])
            assert self.now <= bound, (
                f"the head {tracked} waits until {self.now}, after its shadow and the end "
                f"of the grants running on its GPUs when it became head ({bound})"
            )


class EasyMachine(CoreMachine):
    POLICY = "easy"
    BACKFILL = "limits"


class EasyEstimatesMachine(CoreMachine):
    POLICY = "easy"
    BACKFILL = "estimates"


class ReserveAllMachine(CoreMachine):
    POLICY = "reserve-all"


class EasyBoundedMachine(CoreMachine):
    """Every demand carries a limit and grants end by it: rule 6e's bound is checked."""

    POLICY = "easy"
    BACKFILL = "limits"
    BOUNDED = True


class EasyEstimatesBoundedMachine(EasyBoundedMachine):
    BACKFILL = "estimates"


SETTINGS = settings(
    max_examples=500 if LONG else 60,
    stateful_step_count=60 if LONG else 40,
    deadline=None,
    derandomize=not LONG,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
for machine in (
    EasyMachine,
    EasyEstimatesMachine,
    ReserveAllMachine,
    EasyBoundedMachine,
    EasyEstimatesBoundedMachine,
):
    machine.TestCase.settings = SETTINGS

TestEasy = EasyMachine.TestCase
TestEasyEstimates = EasyEstimatesMachine.TestCase
TestReserveAll = ReserveAllMachine.TestCase
TestEasyBounded = EasyBoundedMachine.TestCase
TestEasyEstimatesBounded = EasyEstimatesBoundedMachine.TestCase


# ----------------------------------------------------------------- defects found
@pytest.mark.parametrize("where", ["submit", "walk"])
def test_a_head_chosen_by_a_yield_is_granted_if_it_fits(where: str) -> None:
    """Rule 5e: the head is granted as soon as it fits anywhere. GPUs 0 and 1 partly held; a
    3-GPU request becomes head on GPUs 0, 2 and 3. A request of owner ``a`` arrives: it may
    not go onto the head's GPUs. The head yields to it (rule 10e: ``a`` has less usage), at
    once (its arrival comes later, when usage differs) or at the next release (which frees
    too little for the head); it then fits on GPU 2 and is granted there (the core once left
    it waiting, and GPU 2 idle, until the next input)."""
    core = Scheduler([U] * 4, policy="easy")
    core.restore((0,), 500, now=0.0)
    core.restore((1,), 500, now=0.0)
    small = core.restore((1,), 250, now=0.0)
    big, grant = core.submit(Demand(3, U, whole=True), now=0.0)
    assert grant is None
    arrival = 0.5 if where == "submit" else 0.0
    ticket, grant = core.submit(Demand(1, 700, owner="a"), now=arrival)
    if where == "walk":
        assert grant is None and core.is_waiting(ticket)
        grants = core.release_granted(small, now=0.5)
        assert [g.ticket for g in grants] == [ticket]
        grant = grants[0]
    assert grant is not None and grant.ticket == ticket and not core.is_waiting(ticket)
    head = core.head
    assert head is not None and head.ticket == big  # the head it passed, head again


def test_an_easy_head_never_reserves_one_memory_twice() -> None:
    """GPUs 0 and 1 share a memory; GPU 3 is half the size. A 3-GPU request can only be
    granted GPUs 2, 3 and one of 0 and 1: it reserves those (not 0, 1 and 2, as the core did
    once, leaving GPU 3 open to a stream of short requests that starved it), so a short
    request with a limit past its shadow waits, and the head is granted at the release."""
    core = Scheduler([U, U, U, U // 2], policy="easy", memory_groups=["gi", "gi", None, None])
    _, running = core.submit(Demand(1, 1, limit=2.0), now=0.0)
    assert running is not None and running.gpus == (3,)
    head, grant = core.submit(Demand(3, U, whole=True), now=0.0)
    assert grant is None
    reserved = core.reservations()[head]
    assert len({0, 1} & set(reserved)) == 1 and {2, 3} <= set(reserved), reserved
    short, granted = core.submit(Demand(1, 1, limit=2.0), now=1.0)  # ends past the shadow
    assert granted is None and core.is_waiting(short)
    grants = core.release_granted(running, now=1.0)
    assert [g.ticket for g in grants][:1] == [head] and not core.is_waiting(head)


def test_restore_keeps_a_memory_within_capacity() -> None:
    core = Scheduler([U, U], memory_groups=["gi", "gi"])
    with pytest.raises(ValueError, match=r"1200 units on GPUs \[0, 1\], which share one memory"):
        core.restore((0, 1), 600, now=0.0)  # 1200 units of a memory of 1000
    assert core.memory_held() == (((0, 1), U, 0),) and core.free == (U, U)
    core.restore((0, 1), 500, now=0.0)  # exactly the memory
    with pytest.raises(ValueError, match="share one memory"):
        core.rebuild([(1, ((0, 600), (1, 600)))], [], now=1.0)
    ((_, capacity, used),) = core.memory_held()
    assert used == capacity == U
