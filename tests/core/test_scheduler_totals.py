"""GPUs of different sizes (per-GPU totals): each rule's definition, bad totals, demands that
can never fit, relative demands (a share of whichever GPU), and a state machine over random
totals checked against a from-scratch reference.
"""

from __future__ import annotations

import copy
import math
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand, Grant, Scheduler


def test_an_int_keeps_equal_totals() -> None:
    assert Scheduler(3, policy="reserve-all").totals == (UNITS_PER_GPU,) * 3
    assert Scheduler(2, 10, policy="reserve-all").totals == (10, 10)
    core = Scheduler([7, 3], policy="reserve-all")
    assert core.totals == (7, 3) and core.free == (7, 3) and core.num_gpus == 2
    assert core.units_per_gpu == 7  # the largest


@pytest.mark.parametrize(
    ("gpus", "error", "match"),
    [
        ([], ValueError, "gpus"),
        ([0], ValueError, r"gpus\[0\]"),
        ([4, -1], ValueError, r"gpus\[1\]"),
        ([True], TypeError, r"gpus\[0\]"),
        ([1.5], TypeError, r"gpus\[0\]"),
        ("12", TypeError, "gpus"),
        (2.0, TypeError, "gpus"),
        ({1, 2}, TypeError, "gpus"),
    ],
)
def test_bad_totals(gpus: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Scheduler(gpus, policy="reserve-all")  # type: ignore[arg-type]


def test_units_per_gpu_only_with_a_count() -> None:
    with pytest.raises(TypeError, match="units_per_gpu"):
        Scheduler([4, 4], 4, policy="reserve-all")


@pytest.mark.parametrize("uniform", [True, False])
def test_a_demand_that_can_never_fit_is_refused_and_changes_nothing(uniform: bool) -> None:
    core = Scheduler([10, 10] if uniform else [10, 4], policy="reserve-all")
    core.submit(Demand(2, 1, whole=True))  # every GPU taken
    waiting, _ = core.submit(Demand(1, 3))
    before = (core.free, core.reservations(), core.queue_length)
    with pytest.raises(ValueError, match=r"units.* got 11"):
        core.submit(Demand(1, 11))
    with pytest.raises(ValueError, match=r"count.* got 3"):
        core.submit(Demand(3, 10))
    with pytest.raises(ValueError, match=r"count.* got 3"):
        core.grant_now(Demand(3, 10, whole=True))
    with pytest.raises(ValueError, match=r"units.* got 0"):
        core.grant_now(Demand(1, 0))
    assert (core.free, core.reservations(), core.queue_length) == before
    assert core.is_waiting(waiting)


def test_best_fit_is_fewest_free_units_that_fit_ties_to_lowest_index() -> None:
    core = Scheduler([100, 10, 40, 40], policy="reserve-all")
    assert core.submit(Demand(1, 30))[1] == Grant(1, (2,), 30)  # 40 free beats 100; index 2 < 3
    assert core.submit(Demand(1, 10))[1] == Grant(2, (1,), 10)  # 10 free on GPUs 1 and 2: GPU 1
    assert core.submit(Demand(1, 50))[1] == Grant(3, (0,), 50)  # only GPU 0 holds 50


def test_whole_gpus_need_completely_free_gpus_smallest_first() -> None:
    core = Scheduler([100, 10, 40, 10], policy="reserve-all")
    core.submit(Demand(1, 1))  # best fit: GPU 1 (10 free) is no longer completely free
    _, grant = core.submit(Demand(2, 0))
    assert grant is not None and grant.gpus == (2, 3) and grant.units == 0  # sizes 40 and 10
    assert core.held(grant) == ((2, 40), (3, 10))
    _, one = core.submit(Demand(1, 5, whole=True))
    assert one is not None and one.gpus == (0,) and one.units == 100 and core.free[0] == 0
    core.release_many(core.held(grant))
    assert core.free == (0, 9, 40, 10)


def test_fraction_reserves_most_free_gpu_that_could_ever_hold_it() -> None:
    core = Scheduler([30, 100], policy="reserve-all")
    core.submit(Demand(1, 80))  # GPU 1: 20 free; GPU 0 (30, idle) is more free but too small
    waiter, _ = core.submit(Demand(1, 50))
    assert core.reservations() == {waiter: (1,)}
    assert core.submit(Demand(1, 20))[1] == Grant(3, (0,), 20)  # backfill on GPU 0 only


def test_whole_waiter_reserves_gpus_with_fewest_units_in_use() -> None:
    core = Scheduler([10, 100, 50], policy="reserve-all")
    core.submit(Demand(1, 8))  # GPU 0: 2 free, 8 used
    core.submit(Demand(1, 30))  # GPU 2 (50): 20 free, 30 used
    core.submit(Demand(1, 25))  # GPU 2 has only 20: GPU 1, 75 free, 25 used
    waiter, _ = core.submit(Demand(2, 0))
    assert core.reservations() == {waiter: (0, 1)}  # 8 and 25 in use, not the most free units


def test_equal_totals_as_a_sequence_schedule_as_an_int() -> None:
    rng = random.Random(5)
    a, b = (
        Scheduler(3, 1000, policy="reserve-all"),
        Scheduler([1000, 1000, 1000], policy="reserve-all"),
    )
    held: list[Grant] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            grant = held.pop(rng.randrange(len(held)))
            got = [a.release_many(a.held(grant)), b.release_many(b.held(grant))]
        else:
            demand = (
                Demand(rng.randint(2, 3), 1000)
                if rng.random() < 0.2
                else Demand(1, rng.randint(1, 1000))
            )
            _, ga = a.submit(demand)
            _, gb = b.submit(demand)
            got = [[ga] if ga else [], [gb] if gb else []]
        assert got[0] == got[1] and a.reservations() == b.reservations()
        held.extend(got[0])


# ----------------------------------------------------------------- relative demands
HALF = Demand(1, UNITS_PER_GPU // 2, relative=True)
GIB = 1024


def relative(fraction: float) -> Demand:
    return Demand(1, round(fraction * UNITS_PER_GPU), relative=True)


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_a_relative_demand_needs_its_share_of_the_gpu_it_lands_on(policy: str) -> None:
    core = Scheduler([80 * GIB, 24 * GIB], policy=policy)
    # Best fit, least left after the grant: 12 GiB left on the 24 GiB GPU, 40 on the other.
    assert core.submit(HALF)[1] == Grant(1, (1,), 12 * GIB)
    assert core.submit(HALF)[1] == Grant(2, (1,), 12 * GIB)
    assert core.submit(HALF)[1] == Grant(3, (0,), 40 * GIB)  # only the 80 GiB GPU has room
    assert core.free == (40 * GIB, 0)
    assert core.held(Grant(3, (0,), 40 * GIB)) == ((0, 40 * GIB),)
    assert core.release(1, 12 * GIB) == []
    assert core.release(0, 40 * GIB) == []
    assert core.free == (80 * GIB, 12 * GIB)


def test_relative_best_fit_is_least_left_not_fewest_free() -> None:
    core = Scheduler([100, 40], policy="reserve-all")
    core.restore((0,), 40)  # 60 free: half of 100 is 50, which leaves 10
    # GPU 1 has fewer free (40), but half of it (20) leaves 20: GPU 0 is the best fit.
    assert core.submit(HALF)[1] == Grant(2, (0,), 50)


@pytest.mark.parametrize(("used_on_1", "expected"), [(10, (0,)), (15, (1,))])
def test_relative_best_fit_ties_to_the_lowest_index(
    used_on_1: int, expected: tuple[int, ...]
) -> None:
    core = Scheduler([100, 40], policy="reserve-all")
    core.restore((0,), 40)  # 60 free, half is 50: 10 left
    core.restore((1,), used_on_1)  # 30 free, half is 20: 10 left (a tie); or 25: 5 left
    assert core.submit(HALF)[1] == Grant(3, expected, 50 if expected == (0,) else 20)


def test_rounding_is_up_exact_and_at_least_one_unit() -> None:
    core = Scheduler([3, 7, 1], policy="reserve-all")
    tiny = Demand(1, 1, relative=True)  # a 63-millionth of a GPU: one unit anywhere
    assert core.submit(tiny)[1] == Grant(1, (2,), 1)  # leaves 0 on the 1-unit GPU
    third = Demand(1, UNITS_PER_GPU // 3, relative=True)  # 1 of 3 exactly, 3 of 7 (up)
    assert core.submit(third)[1] == Grant(2, (0,), 1)  # 2 left on GPU 0, 4 on GPU 1
    assert core.submit(third)[1] == Grant(3, (0,), 1)
    assert core.submit(third)[1] == Grant(4, (0,), 1)
    assert core.free == (0, 7, 0)
    assert core.submit(third)[1] == Grant(5, (1,), math.ceil(7 / 3))


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_on_gpus_of_one_size_a_relative_demand_is_the_absolute_one(policy: str) -> None:
    core = Scheduler([80, 80], policy=policy)
    assert core.submit(relative(0.3))[1] == Grant(1, (0,), 24)
    assert core.submit(Demand(1, UNITS_PER_GPU, relative=True))[1] == Grant(2, (1,), 80)
    assert core.submit(Demand(1, 50))[1] == Grant(3, (0,), 50)
    waiting, grant = core.submit(HALF)
    assert grant is None and core.is_waiting(waiting)
    assert [w.demand for w in core.waiters()] == [Demand(1, 40)]  # the fast path's demand


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
@pytest.mark.parametrize("totals", [[80, 24], [80, 80]])
@pytest.mark.parametrize(
    ("demand", "match"),
    [
        (Demand(2, 100, relative=True), "count must be 1 and whole False, got count=2"),
        (Demand(1, 100, whole=True, relative=True), "got count=1, whole=True"),
        (Demand(1, 0, relative=True), f"between 1 and {UNITS_PER_GPU} .*got 0"),
        (Demand(1, UNITS_PER_GPU + 1, relative=True), f"got {UNITS_PER_GPU + 1}"),
        (Demand(1, -5, relative=True), "got -5"),
    ],
)
def test_a_bad_relative_demand_is_refused_and_changes_nothing(
    policy: str, totals: list[int], demand: Demand, match: str
) -> None:
    core = Scheduler(totals, policy=policy)
    core.restore((0,), 70)
    core.restore((1,), totals[1] - 5)
    waiting, _ = core.submit(Demand(1, 20))
    before = (core.free, core.reservations(), core.queue_length, list(core.waiters()))
    with pytest.raises(ValueError, match=match):
        core.submit(demand)
    with pytest.raises(ValueError, match=match):
        core.grant_now(demand)
    with pytest.raises(ValueError, match=match):
        core.expected(demand)
    assert (core.free, core.reservations(), core.queue_length, list(core.waiters())) == before
    assert core.is_waiting(waiting)


def test_a_relative_waiter_reserves_the_gpu_closest_to_its_need() -> None:
    core = Scheduler([100, 40], policy="reserve-all")
    core.restore((0,), 60)  # 40 free, needs 50: 10 short
    core.restore((1,), 35)  # 5 free, needs 20: 15 short
    waiter, grant = core.submit(HALF)
    assert grant is None
    assert core.reservations() == {waiter: (0,)}
    other = Scheduler([100, 40], policy="reserve-all")
    other.restore((0,), 80)  # 20 free, 30 short
    other.restore((1,), 30)  # 10 free, 10 short: closer, though fewer units are free
    waiter, _ = other.submit(HALF)
    assert other.reservations() == {waiter: (1,)}
    assert other.release(1, 10) == [Grant(waiter, (1,), 20)]


def test_easy_head_of_a_relative_demand_ties_to_the_most_free_beyond_its_need() -> None:
    core = Scheduler([100, 40], policy="easy")
    core.restore((0,), 80)  # 30 short of half
    core.restore((1,), 30)  # 10 short of half; nothing is learned yet, so both are a tie
    head, grant = core.submit(HALF)
    assert grant is None
    assert core.reservations() == {head: (1,)}
    # Best fit for 10 would be GPU 1 (10 free, 0 left), but the head reserves it.
    assert core.grant_now(Demand(1, 10)) == Grant(4, (0,), 10)
    assert core.release(1, 30) == [Grant(head, (1,), 20)]


def test_easy_backfill_beside_a_relative_head_leaves_its_need_on_its_gpu() -> None:
    """Rule 4e before the shadow: a backfill on the head's GPU must leave the head's need
    *there* (75 of GPU 1's 100) free at the shadow, not its units or its need elsewhere."""
    core = Scheduler([1000, 100], policy="easy")
    _, learn = core.submit(Demand(1, 10), now=0.0)
    assert learn is not None
    core.release(learn.gpus[0], 10, ticket=learn.ticket, now=100.0)  # mean hold: 100 s
    assert core.submit(Demand(1, 1000), now=100.0, expected=1000.0)[1] is not None
    assert core.submit(Demand(1, 60, limit=50.0), now=100.0)[1] == Grant(3, (1,), 60)
    head, grant = core.submit(relative(0.75), now=100.0)  # 750 on GPU 0, 75 on GPU 1
    assert grant is None
    assert core.head is not None and core.head.gpus == (1,) and core.head.shadow == 150.0
    # Expected to run 100 s, past the shadow: only if 100 - units >= 75 at the shadow.
    assert core.grant_now(Demand(1, 26), now=100.0) is None
    assert core.grant_now(Demand(1, 25), now=100.0) == Grant(5, (1,), 25)
    assert core.release(1, 60, now=150.0) == [Grant(head, (1,), 75)]


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_the_walk_reaches_a_relative_waiter_that_fits_on_a_small_gpu(policy: str) -> None:
    """Reservations have stopped, so the walk stops early once no waiter further back could
    fit: it must count a relative demand by its need on the smallest GPU (50 here), not by
    its units nor its need on the largest (500)."""
    core = Scheduler([1000, 100], policy=policy)
    core.restore((0,), 1000)
    core.restore((1,), 100)
    big, _ = core.submit(Demand(1, 1000))  # reserves GPU 0
    pair, _ = core.submit(Demand(2, 1, whole=True))  # cannot reserve two: reservations stop
    half, _ = core.submit(HALF)  # 500 on GPU 0, 50 on GPU 1
    assert core.release(1, 60) == [Grant(half, (1,), 50)]
    assert core.is_waiting(big) and core.is_waiting(pair)


def test_relative_and_absolute_demands_learn_apart() -> None:
    core = Scheduler([80_000_000, 24], policy="easy")
    absolute = Demand(1, UNITS_PER_GPU // 2)  # the same number of units, absolute
    _, first = core.submit(absolute, now=0.0)
    _, second = core.submit(HALF, now=0.0)
    assert first is not None and second is not None and second.gpus == (1,)
    core.release_many(core.held(second), ticket=second.ticket, now=2.0)
    core.release_many(core.held(first), ticket=first.ticket, now=10.0)
    assert core.expected(absolute) == 10.0
    assert core.expected(HALF) == 2.0


# ----------------------------------------------------------------- state machine
def need(core: Scheduler, d: Demand, gpu: int) -> int:
    """Units ``d`` needs on ``gpu``, from scratch (rule 1)."""
    if d.count > 1 or d.whole:
        return core.totals[gpu]
    if d.relative:
        return max(1, math.ceil(d.units * core.totals[gpu] / UNITS_PER_GPU))
    return d.units


def reference_reservations(core: Scheduler) -> dict[int, tuple[int, ...]]:
    """Rule 3 from scratch on GPUs of any sizes."""
    free, totals = core.free, core.totals
    unreserved = list(range(core.num_gpus))
    result: dict[int, tuple[int, ...]] = {}
    for w in core.waiters():
        d = w.demand
        if d.count > 1 or d.whole:
            if len(unreserved) < d.count:
                break
            chosen = sorted(unreserved, key=lambda g: (totals[g] - free[g], g))[: d.count]
        else:
            able = [g for g in unreserved if totals[g] >= need(core, d, g)]
            if not able:
                break
            chosen = sorted(able, key=lambda g: (need(core, d, g) - free[g], g))[:1]
        for g in chosen:
            unreserved.remove(g)
        result[w.ticket] = tuple(sorted(chosen))
    return result


def reference_best_fit(
    totals: list[int], free: tuple[int, ...], d: Demand
) -> tuple[tuple[int, ...], int] | None:
    """Rule 2 from scratch over every GPU: the GPUs and ``Grant.units``, or None."""
    if d.count > 1 or d.whole:
        idle = [g for g in range(len(totals)) if free[g] == totals[g]]
        if len(idle) < d.count:
            return None
        chosen = tuple(sorted(sorted(idle, key=lambda g: (totals[g], g))[: d.count]))
        sizes = {totals[g] for g in chosen}
        return chosen, sizes.pop() if len(sizes) == 1 else 0
    needs = [max(1, -(-d.units * t // UNITS_PER_GPU)) if d.relative else d.units for t in totals]
    fitting = [g for g in range(len(totals)) if free[g] >= needs[g]]
    if not fitting:
        return None
    best = min(fitting, key=lambda g: (free[g] - needs[g], g))
    return (best,), needs[best]


def fits(core: Scheduler, d: Demand, gpus: list[int]) -> bool:
    free, totals = core.free, core.totals
    if d.count > 1 or d.whole:
        return sum(1 for g in gpus if free[g] == totals[g]) >= d.count
    return any(free[g] >= need(core, d, g) for g in gpus)


totals_strategy = st.lists(
    st.one_of(st.just(1), st.integers(2, 1000), st.just(10**15)), min_size=1, max_size=5
)


class TotalsMachine(RuleBasedStateMachine):
    @initialize(totals=totals_strategy)
    def start(self, totals: list[int]) -> None:
        self.core = Scheduler(totals, policy="reserve-all")
        self.totals = totals
        self.held: list[tuple[int, int]] = []
        self.waiting: set[int] = set()

    def _absorb(self, grants: list[Grant]) -> None:
        for grant in grants:
            assert grant.ticket in self.waiting
            self.waiting.discard(grant.ticket)
            self.held.extend(self.core.held(grant))

    def _submit(self, demand: Demand) -> None:
        idle_queue, free = self.core.queue_length == 0, self.core.free
        ticket, grant = self.core.submit(demand)
        if idle_queue:  # nobody waited: rule 2 over every GPU, under either policy
            expected = reference_best_fit(self.totals, free, demand)
            assert (None if grant is None else (grant.gpus, grant.units)) == expected
        self.waiting.add(ticket)
        self._absorb([grant] if grant else [])

    @rule(data=st.data())
    def submit_fraction(self, data: st.DataObject) -> None:
        largest = max(self.totals)
        units = data.draw(st.one_of(st.integers(1, min(largest, 1200)), st.just(largest)))
        self._submit(Demand(1, units))

    @rule(units=st.one_of(st.integers(1, UNITS_PER_GPU), st.sampled_from([1, UNITS_PER_GPU])))
    def submit_relative(self, units: int) -> None:
        self._submit(Demand(1, units, relative=True))

    @rule(data=st.data(), whole=st.booleans())
    def submit_whole(self, data: st.DataObject, whole: bool) -> None:
        count = (
            data.draw(st.integers(1 if whole else 2, len(self.totals)))
            if whole or len(self.totals) > 1
            else 0
        )
        if count:
            self._submit(Demand(count, 1, whole=whole))

    @rule(units=st.integers(1, 10**16))
    def never_fits(self, units: int) -> None:
        before = (self.core.free, self.core.reservations(), self.core.queue_length)
        if units > max(self.totals):
            with pytest.raises(ValueError):
                self.core.submit(Demand(1, units))
        with pytest.raises(ValueError):
            self.core.submit(Demand(len(self.totals) + 1, 1))
        with pytest.raises(ValueError):
            self.core.submit(Demand(1, units + UNITS_PER_GPU, relative=True))
        with pytest.raises(ValueError):
            self.core.grant_now(Demand(2, 1, relative=True))
        assert (self.core.free, self.core.reservations(), self.core.queue_length) == before

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        gpu, units = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self._absorb(self.core.release(gpu, units))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(ticket)
        self._absorb(self.core.cancel(ticket))

    @invariant()
    def conservation_and_no_over_grant(self) -> None:
        for gpu, total in enumerate(self.totals):
            granted = sum(u for g, u in self.held if g == gpu)
            assert 0 <= self.core.free[gpu] <= total
            assert self.core.free[gpu] + granted == total

    @invariant()
    def reservations_follow_the_rule_and_are_disjoint(self) -> None:
        assert {w.ticket for w in self.core.waiters()} == self.waiting
        res = self.core.reservations()
        assert res == reference_reservations(self.core)
        flat = [g for gpus in res.values() for g in gpus]
        assert len(flat) == len(set(flat))

    @invariant()
    def walk_left_nothing_grantable(self) -> None:
        res = self.core.reservations()
        before: set[int] = set()
        for w in self.core.waiters():
            assert not fits(
                self.core, w.demand, [g for g in range(len(self.totals)) if g not in before]
            )
            before.update(res.get(w.ticket, ()))

    @invariant()
    def head_is_not_starved(self) -> None:
        """The head holds a reservation that could hold it, and gets it once work drains."""
        head = next(iter(self.core.waiters()), None)
        if head is None:
            return
        assert head.reserved
        core = copy.deepcopy(self.core)
        granted = core.release_many(list(self.held))
        assert head.ticket in {g.ticket for g in granted}


TotalsMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestTotalsMachine = TotalsMachine.TestCase
