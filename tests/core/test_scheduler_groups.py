"""Rule 12: groups of GPUs (the machines of a cluster), within which a multi-GPU demand is
placed and reserves.

Bad input, placement and reservation under both policies, the wide head that a stream of
small requests cannot starve, random state machines that check the rule and the head's bound
(rule 6e) on groups, and that one group (the default) decides exactly as no groups do.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hwpool._core._scheduler import POLICIES, Demand, Grant, Scheduler

U = 1_000


def frac(x: float) -> Demand:
    return Demand(1, round(x * U))


def whole(n: int) -> Demand:
    return Demand(n, U)


def group_of(core: Scheduler) -> dict[int, int]:
    """GPU -> the index of its group."""
    return {gpu: i for i, gpus in enumerate(core.groups) for gpu in gpus}


def within_one_group(core: Scheduler, gpus: Sequence[int]) -> bool:
    groups = group_of(core)
    return len({groups[gpu] for gpu in gpus}) == 1


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        (5, TypeError, r"groups must be a sequence with each GPU's group, got 5 \(int\)"),
        ("aabb", TypeError, r"groups must be a sequence .* got 'aabb' \(str\)"),
        ({"a": 1}, TypeError, r"groups must be a sequence"),
        (["a", "a", "b"], ValueError, r"groups must name one group per GPU \(4\), got 3"),
        ([], ValueError, r"groups must name one group per GPU \(4\), got 0"),
        (["a", ["x"], "b", "b"], TypeError, r"groups\[1\] must be hashable, got \['x'\] \(list\)"),
    ],
)
def test_bad_groups_are_refused_by_name(groups: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Scheduler(4, U, groups=groups)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", POLICIES)
def test_more_gpus_than_any_group_has_is_refused_and_changes_nothing(policy: str) -> None:
    core = Scheduler(5, U, policy=policy, groups=["a", "a", "b", "b", "b"])
    assert core.submit(frac(0.5))[1] is not None
    before = (core.free, core.queue_length, core.reservations())
    message = r"count must be at most 3 \(whole GPUs within one group: the largest group has 3\)"
    with pytest.raises(ValueError, match=message + ", got 4"):
        core.submit(whole(4))
    with pytest.raises(ValueError, match=message + ", got 4"):
        core.grant_now(whole(4))
    with pytest.raises(ValueError, match=r"count must be between 1 and num_gpus=5"):
        core.submit(whole(6))
    assert (core.free, core.queue_length, core.reservations()) == before


def test_groups_in_the_order_of_their_lowest_gpu_and_one_group_by_default() -> None:
    assert Scheduler(4, U, groups=["b", "a", "b", "a"]).groups == ((0, 2), (1, 3))
    assert Scheduler(3, U).groups == ((0, 1, 2),)
    assert Scheduler(3, U, groups=[7, 7, 7]).groups == ((0, 1, 2),)


# ----------------------------------------------------------------- placement (rule 2)
@pytest.mark.parametrize("policy", POLICIES)
def test_two_idle_gpus_on_two_groups_do_not_make_a_two_gpu_grant(policy: str) -> None:
    """GPUs 1 and 2 idle, one in each group: no grant of two (without groups: (1, 2))."""
    for groups, expected in [(None, (1, 2)), (["A", "A", "B", "B"], None)]:
        core = Scheduler(4, U, policy=policy, groups=groups)
        for _ in range(4):
            core.submit(whole(1))
        core.release(1, U)
        core.release(2, U)
        _, grant = core.submit(whole(2))
        assert (None if grant is None else grant.gpus) == expected
        if grant is None:
            assert core.release(0, U) == [Grant(5, (0, 1), U)]  # group A drains


@pytest.mark.parametrize("policy", POLICIES)
def test_a_multi_gpu_demand_takes_the_group_with_the_fewest_idle_gpus(policy: str) -> None:
    core = Scheduler(5, U, policy=policy, groups=["big", "big", "big", "small", "small"])
    _, grant = core.submit(whole(2))
    assert grant is not None and grant.gpus == (3, 4)  # the 3-GPU group stays whole
    _, grant = core.submit(whole(3))
    assert grant is not None and grant.gpus == (0, 1, 2)


def test_a_multi_gpu_demand_takes_the_group_of_the_smallest_gpus() -> None:
    core = Scheduler([2 * U, 2 * U, U, U, U], groups=["a", "a", "b", "b", "b"])
    _, grant = core.submit(Demand(2, 1, whole=True))
    assert grant is not None and grant.gpus == (2, 3) and grant.units == U


def test_single_gpu_demands_ignore_groups() -> None:
    core = Scheduler(4, U, groups=[0, 0, 1, 1])
    for expected in [(0,), (0,), (1,)]:
        _, grant = core.submit(frac(0.5))
        assert grant is not None and grant.gpus == expected


# ----------------------------------------------------------------- reservation (rules 3, 3e)
def test_the_easy_head_reserves_the_group_expected_to_drain_first() -> None:
    """Work on GPU 1 and 2 ends soonest, but they are in two groups: the head reserves the
    group whose second GPU frees first (B: GPU 3 at 5 s, against GPU 0 at 10 s)."""
    for groups, reserved in [(None, (1, 2)), (["A", "A", "B", "B"], (2, 3))]:
        core = Scheduler(4, U, groups=groups)
        for seconds in [10.0, 1.0, 1.0, 5.0]:
            assert core.submit(whole(1), now=0.0, expected=seconds)[1] is not None
        ticket, _ = core.submit(whole(2), now=0.0)
        assert core.reservations() == {ticket: reserved}
        assert core.head is not None and core.head.shadow == (5.0 if groups else 1.0)


def test_reserve_all_reserves_within_the_group_with_the_least_in_use() -> None:
    """GPUs 1 and 2 have the fewest units in use (rule 3 without groups: (1, 2)); group B
    has fewer in all (500 against 1000), so B for the first; A, the only group left, for the
    second."""
    for groups, reserved in [(None, [(1, 2), (0, 3)]), (["A", "A", "B", "B"], [(2, 3), (0, 1)])]:
        core = Scheduler(4, U, policy="reserve-all", groups=groups)
        for gpu, units in enumerate([900, 100, 200, 300]):
            core._free[gpu] -= units  # held by grants made elsewhere (as test_scheduler does)
        first, _ = core.submit(whole(2))
        second, _ = core.submit(whole(2))
        reservations = core.reservations()
        assert [reservations.get(first), reservations.get(second)] == reserved
    core = Scheduler(4, U, policy="reserve-all", groups=["A", "A", "B", "B"])
    for _ in range(4):
        core.submit(frac(0.6))  # one on each GPU
    first, _ = core.submit(whole(2))
    second, _ = core.submit(whole(2))
    third, _ = core.submit(whole(2))  # no group left: reservations stop
    assert core.reservations() == {first: (0, 1), second: (2, 3)}
    assert core.is_waiting(third)


def test_a_reserve_all_waiter_finding_no_group_stops_reservations_behind_it() -> None:
    core = Scheduler(4, U, policy="reserve-all", groups=["A", "A", "A", "B"])
    for _ in range(4):
        core.submit(whole(1))
    small, _ = core.submit(frac(0.5))  # reserves GPU 0 (most free: a tie, lowest index)
    wide, _ = core.submit(whole(3))  # A has two left: no group holds three
    behind, _ = core.submit(frac(0.5))
    assert core.reservations() == {small: (0,)}
    assert wide not in core.reservations() and behind not in core.reservations()


# ----------------------------------------------------------------- the wide head is not starved
def quarter_stream_wait(groups: list[str] | None, policy: str = "easy") -> tuple[float, bool]:
    """Four GPUs full of quarter tasks (one second each, ending in turn), a 2-GPU request,
    then a quarter request on every release. When is the 2-GPU request granted, and on one
    group?"""
    core = Scheduler(4, U, policy=policy, groups=groups)
    live: list[tuple[float, Grant]] = []
    now = 0.0
    for i in range(16):
        _, grant = core.submit(frac(0.25), now=now)
        assert grant is not None
        live.append((1.0 + i / 16, grant))
    wide, grant = core.submit(whole(2), now=now)
    assert grant is None
    live.sort(key=lambda item: item[0])
    while live:
        now, done = live.pop(0)
        granted = core.release_many(core.held(done), ticket=done.ticket, now=now)
        for g in granted:
            if g.ticket == wide:
                return now, within_one_group(core, g.gpus)
            live.append((now + 1.0, g))
        _, grant = core.submit(frac(0.25), now=now)
        if grant is not None:
            live.append((now + 1.0, grant))
        live.sort(key=lambda item: item[0])
        assert now < 100.0, "the 2-GPU request starves"
    raise AssertionError("the stream ran dry first")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_two_gpu_request_gets_one_group_within_one_task_length(policy: str) -> None:
    """The tasks on the GPUs it reserves end within a second of its arrival, and nothing new
    lands there: granted by then, on one group."""
    at, one_group = quarter_stream_wait(["A", "A", "B", "B"], policy)
    assert at <= 2.0 and one_group


# ----------------------------------------------------------------- random state machines
class GroupsMachine(RuleBasedStateMachine):
    """Random submits, releases and cancels on a clock, on 5 GPUs in groups of 3 and 2.

    After every step: capacity adds up; every grant and reservation of several GPUs lies in
    one group; under ``easy`` only the head reserves, and giving back what runs on its GPUs
    (at its shadow or later) grants it (rule 6e); under ``reserve-all``, reservations are
    disjoint, and giving back everything grants the head.
    """

    POLICY = "easy"
    GROUPS: tuple[Hashable, ...] = ("a", "a", "a", "b", "b")

    def __init__(self) -> None:
        super().__init__()
        self.core = Scheduler(len(self.GROUPS), U, policy=self.POLICY, groups=self.GROUPS)
        self.now = 0.0
        self.live: dict[int, Grant] = {}
        self.waiting: set[int] = set()

    def _absorb(self, grants: list[Grant]) -> None:
        for grant in grants:
            assert grant.ticket in self.waiting
            assert within_one_group(self.core, grant.gpus), f"{grant} spans groups"
            self.waiting.discard(grant.ticket)
            self.live[grant.ticket] = grant

    def _submit(self, demand: Demand, step: float, hint: float | None = None) -> None:
        self.now += step
        ticket, grant = self.core.submit(demand, now=self.now, expected=hint)
        self.waiting.add(ticket)
        self._absorb([grant] if grant else [])

    @rule(
        units=st.sampled_from([250, 500, 600, U]),
        hint=st.one_of(st.none(), st.floats(0, 50)),
        step=st.floats(0, 5),
    )
    def submit_fraction(self, units: int, hint: float | None, step: float) -> None:
        self._submit(Demand(1, units), step, hint)

    @rule(count=st.integers(2, 3), step=st.floats(0, 5))
    def submit_whole(self, count: int, step: float) -> None:
        self._submit(whole(count), step)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), step=st.floats(0, 20))
    def release(self, data: st.DataObject, step: float) -> None:
        self.now += step
        grant = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        held = self.core.held(grant)
        self._absorb(self.core.release_many(held, ticket=grant.ticket, now=self.now))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), step=st.floats(0, 5))
    def cancel(self, data: st.DataObject, step: float) -> None:
        self.now += step
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(ticket)
        self._absorb(self.core.cancel(ticket, now=self.now))

    @invariant()
    def capacity_adds_up(self) -> None:
        for gpu in range(self.core.num_gpus):
            held = sum(g.units for g in self.live.values() if gpu in g.gpus)
            assert self.core.free[gpu] + held == U

    @invariant()
    def reservations_lie_in_one_group_and_are_disjoint(self) -> None:
        assert {w.ticket for w in self.core.waiters()} == self.waiting
        reserved = self.core.reservations()
        for gpus in reserved.values():
            assert within_one_group(self.core, gpus)
        flat = [gpu for gpus in reserved.values() for gpu in gpus]
        assert len(flat) == len(set(flat))

    @invariant()
    def the_head_is_granted_once_its_gpus_are_given_back(self) -> None:
        head = next(iter(self.core.waiters()), None)
        if head is None:
            return
        core = copy.deepcopy(self.core)
        if self.POLICY == "easy":
            assert core.head is not None and core.head.ticket == head.ticket
            assert core.reservations() == {head.ticket: core.head.gpus}
            gpus = set(core.head.gpus)
            at = max(self.now, core.head.shadow)
        else:
            assert head.reserved
            gpus, at = set(range(core.num_gpus)), self.now
        there = [g for g in self.live.values() if not gpus.isdisjoint(g.gpus)]
        pairs = [pair for grant in there for pair in core.held(grant)]
        granted = core.release_many(pairs, now=at) if pairs else []
        assert head.ticket in [g.ticket for g in granted]


GroupsMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
TestGroupsMachine = GroupsMachine.TestCase


class ReserveAllGroupsMachine(GroupsMachine):
    POLICY = "reserve-all"


TestReserveAllGroupsMachine = ReserveAllGroupsMachine.TestCase
TestReserveAllGroupsMachine.settings = GroupsMachine.TestCase.settings


class PairsMachine(GroupsMachine):
    """Three machines of two GPUs (the session cluster of tests/ray_pool has two)."""

    GROUPS = ("x", "x", "y", "y", "z", "z")

    @rule(step=st.floats(0, 5))
    def submit_whole(self, count: int = 2, step: float = 0.0) -> None:  # type: ignore[override]
        self._submit(whole(2), step)


TestPairsMachine = PairsMachine.TestCase
TestPairsMachine.settings = GroupsMachine.TestCase.settings


# ----------------------------------------------------------------- the same decisions as before
OPS = st.lists(
    st.tuples(
        st.sampled_from(["fraction", "whole", "release", "cancel"]),
        st.sampled_from([100, 250, 500, 600, U]),
        st.integers(1, 4),
        st.floats(0, 5),
        st.one_of(st.none(), st.floats(0, 30)),
    ),
    max_size=50,
)


Op = tuple[str, int, int, float, float | None]


def decisions(core: Scheduler, ops: list[Op]) -> list[object]:
    """Every answer and reservation ``core`` gives for ``ops``, in order."""
    seen: list[object] = []
    live: list[Grant] = []
    waiting: list[int] = []
    now = 0.0
    for op, units, count, step, hint in ops:
        now += step
        if op in ("fraction", "whole"):
            demand = Demand(1, units) if op == "fraction" else whole(count)
            ticket, grant = core.submit(demand, now=now, expected=hint)
            granted = [grant] if grant else []
            waiting.append(ticket)
        elif op == "release" and live:
            done = live.pop(count % len(live))
            granted = core.release_many(core.held(done), ticket=done.ticket, now=now)
        elif op == "cancel" and waiting:
            ticket = waiting[count % len(waiting)]
            granted = core.cancel(ticket, now=now) if core.is_waiting(ticket) else []
        else:
            continue
        live += granted
        waiting = [t for t in waiting if core.is_waiting(t)]
        head = core.head
        seen.append((granted, core.reservations(), None if head is None else head.shadow))
    return seen


@settings(max_examples=200, deadline=None)
@given(ops=OPS, policy=st.sampled_from(POLICIES))
def test_one_group_decides_exactly_as_no_groups(ops: list[Op], policy: str) -> None:
    assert decisions(Scheduler(4, U, policy=policy, groups=["node"] * 4), ops) == decisions(
        Scheduler(4, U, policy=policy), ops
    )


@settings(max_examples=200, deadline=None)
@given(ops=OPS, policy=st.sampled_from(POLICIES))
def test_groups_change_nothing_for_single_gpu_demands(ops: list[Op], policy: str) -> None:
    """Groups move only multi-GPU demands: with none, the plain walk that groups take decides
    as the fast path does."""
    single = [(op if op != "whole" else "fraction", *rest) for op, *rest in ops]
    assert decisions(Scheduler(4, U, policy=policy, groups=[0, 0, 1, 1]), single) == decisions(
        Scheduler(4, U, policy=policy), single
    )
