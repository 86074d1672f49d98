"""The pure scheduler core: each policy rule and each case of the issue, plus invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hwpool._core._scheduler import Demand, Scheduler

U = 1_000  # a small unit scale keeps the numbers readable: 1.0 GPU == 1000 units


def frac(x: float) -> Demand:
    return Demand(1, round(x * U))


def whole(n: int) -> Demand:
    return Demand(n, U)


def occupy(core: Scheduler, *fractions: float) -> None:
    """Bring each GPU to the given free fraction by granting the rest as one request."""
    for gpu, free in enumerate(fractions):
        used = U - round(free * U)
        if used:
            core._free[gpu] -= used


def make(*free: float) -> Scheduler:
    core = Scheduler(len(free), units_per_gpu=U, policy="reserve-all")
    occupy(core, *free)
    return core


# ----------------------------------------------------------------- rule 1: what fits
def test_fraction_needs_one_gpu_with_enough_free() -> None:
    core = make(0.5, 0.4)
    _, grant = core.submit(frac(0.45))
    assert grant is not None and grant.gpus == (0,) and grant.units == 450
    _, grant = core.submit(frac(0.45))
    assert grant is None  # 0.05 and 0.4 left: nothing fits


def test_whole_needs_completely_free_gpus_all_at_once() -> None:
    core = make(1.0, 0.999, 1.0)
    _, grant = core.submit(whole(2))
    assert grant is not None and grant.gpus == (0, 2)
    core2 = make(1.0, 0.999, 0.5)
    _, grant2 = core2.submit(whole(2))
    assert grant2 is None and core2.free == (1000, 999, 500)  # nothing taken partially


def test_ten_tenths_fill_exactly_one_gpu() -> None:
    core = Scheduler(1, 1_000_000, policy="reserve-all")
    for _ in range(10):
        _, grant = core.submit(Demand(1, 100_000))
        assert grant is not None
    assert core.free == (0,)
    for _ in range(10):
        core.release(0, 100_000)
    assert core.free == (1_000_000,)


# ----------------------------------------------------------------- rule 2: best fit
def test_best_fit_takes_smallest_free_that_fits() -> None:
    core = make(0.9, 0.35, 0.5, 0.3)
    _, grant = core.submit(frac(0.3))
    assert grant is not None and grant.gpus == (3,)
    _, grant = core.submit(frac(0.3))
    assert grant is not None and grant.gpus == (1,)


def test_best_fit_ties_go_to_lowest_index() -> None:
    core = make(1.0, 0.5, 0.5)
    _, grant = core.submit(frac(0.5))
    assert grant is not None and grant.gpus == (1,)


def test_whole_takes_lowest_indexed_free_gpus() -> None:
    core = make(0.5, 1.0, 1.0, 1.0)
    _, grant = core.submit(whole(2))
    assert grant is not None and grant.gpus == (1, 2)


# ----------------------------------------------------------------- rule 3: reservations
def test_waiters_reserve_most_free_gpus_in_queue_order() -> None:
    core = make(0.2, 0.5, 0.4)
    t1, _ = core.submit(frac(0.6))
    t2, _ = core.submit(frac(0.7))
    t3, _ = core.submit(frac(0.9))
    assert core.reservations() == {t1: (1,), t2: (2,), t3: (0,)}


def test_reservations_follow_capacity_as_it_frees() -> None:
    core = make(0.2, 0.5)
    t1, _ = core.submit(frac(0.8))
    assert core.reservations() == {t1: (1,)}
    core.release(0, 500)  # GPU 0 now has 0.7 free: more than GPU 1
    assert core.reservations()[t1] == (0,)


def test_waiter_that_cannot_get_its_set_stops_reservations_behind_it() -> None:
    core = make(0.0, 0.0, 0.0)
    t1, _ = core.submit(frac(0.5))
    t2, _ = core.submit(whole(3))  # only 2 unreserved GPUs left
    t3, _ = core.submit(frac(0.5))
    assert core.reservations() == {t1: (0,)}
    assert t2 not in core.reservations() and t3 not in core.reservations()


# ----------------------------------------------------------------- rule 4: backfill
def test_issue_case_new_small_request_backfills_unreserved_gpu() -> None:
    core = make(0.5, 0.4)
    t1, _ = core.submit(frac(0.6))
    assert core.reservations() == {t1: (0,)}
    _, grant = core.submit(frac(0.3))
    assert grant is not None and grant.gpus == (1,)


def test_reserved_gpu_cannot_be_used_by_a_later_request() -> None:
    core = make(0.5, 0.1)
    core.submit(frac(0.6))  # reserves GPU 0 (0.5 free)
    _, grant = core.submit(frac(0.3))  # would fit on GPU 0, but it is reserved
    assert grant is None
    assert core.grant_now(frac(0.3)) is None


def test_later_waiter_backfills_on_release_without_delaying_head() -> None:
    core = make(0.5, 0.0)
    t1, _ = core.submit(frac(0.6))
    t2, _ = core.submit(frac(0.3))
    assert core.reservations() == {t1: (0,), t2: (1,)}
    grants = core.release(1, 400)
    assert [(g.ticket, g.gpus) for g in grants] == [(t2, (1,))]
    assert core.reservations() == {t1: (0,)}


def test_issue_case_release_grants_second_waiter_on_its_gpu() -> None:
    # G(0.5 reserved by T1=0.6, 0.2 reserved by T2=0.3); 0.2 released on the second GPU.
    core = make(0.5, 0.2)
    t1, _ = core.submit(frac(0.6))
    t2, _ = core.submit(frac(0.3))
    assert core.reservations() == {t1: (0,), t2: (1,)}
    grants = core.release(1, 200)
    assert [(g.ticket, g.gpus) for g in grants] == [(t2, (1,))]
    assert core.is_waiting(t1) and not core.is_waiting(t2)


def test_issue_case_first_freed_gpus_serve_whole_request_then_third_serves_fraction() -> None:
    core = Scheduler(3, units_per_gpu=U, policy="reserve-all")
    holders = [core.submit(whole(1))[1] for _ in range(3)]
    assert all(h is not None for h in holders)
    t1, _ = core.submit(whole(2))
    t2, _ = core.submit(frac(0.5))
    assert core.release(2, U) == []  # first freed GPU: reserved for T1
    assert 2 in core.reservations()[t1]
    grants = core.release(1, U)  # second freed GPU: T1 now has both
    assert [(g.ticket, g.gpus) for g in grants] == [(t1, (1, 2))]
    assert core.reservations() == {t2: (0,)}
    grants = core.release(0, U)  # the third one serves T2
    assert [(g.ticket, g.gpus) for g in grants] == [(t2, (0,))]


def test_grant_now_never_jumps_the_queue() -> None:
    core = make(0.5, 0.5)
    core.submit(frac(0.7))  # reserves GPU 0
    grant = core.grant_now(frac(0.5))
    assert grant is not None and grant.gpus == (1,)
    assert core.grant_now(frac(0.1)) is None
    assert core.queue_length == 1


# ----------------------------------------------------------------- rules 5 and 6
def test_release_grants_every_waiter_that_fits_in_order() -> None:
    core = make(0.0, 0.0)
    tickets = [core.submit(frac(0.25))[0] for _ in range(8)]
    grants = core.release_many([(0, U), (1, U)])
    assert [g.ticket for g in grants] == tickets
    assert core.free == (0, 0)


def test_head_is_granted_when_its_reserved_gpu_drains() -> None:
    core = Scheduler(2, units_per_gpu=U, policy="reserve-all")
    core.submit(frac(0.6))
    core.submit(frac(0.6))  # both GPUs at 0.4 free
    head, _ = core.submit(frac(0.7))
    for _ in range(20):  # a stream of small work cannot take the head's GPU
        grant = core.grant_now(frac(0.1))
        if grant is not None:
            assert grant.gpus[0] not in core.reservations()[head]
    reserved = core.reservations()[head][0]
    used = U - core.free[reserved]
    grants = core.release(reserved, used)
    assert [g.ticket for g in grants] == [head]


class _CountingQueue(dict):  # type: ignore[type-arg]
    """The core's queue, counting the waiters a walk visits."""

    count = 0

    def items(self):  # type: ignore[no-untyped-def, override]
        self.count = 0
        for item in super().items():
            self.count += 1
            yield item


def count_visits(core: Scheduler) -> _CountingQueue:
    queue = _CountingQueue(core._order.queue)
    core._order.queue = queue
    return queue


def test_walk_stops_early_when_nothing_behind_can_fit() -> None:
    core = Scheduler(2, units_per_gpu=U, policy="reserve-all")
    core.submit(whole(2))
    for _ in range(10_000):
        core.submit(frac(0.9))
    visits = count_visits(core)
    grants = core.release(0, U)  # one GPU free: the head waiter takes it, the next reserves
    assert len(grants) == 1
    # The head is granted on GPU 0, the next two reserve GPUs 0 and 1; the walk takes one more
    # waiter from the queue, sees no GPU left open, and stops.
    assert visits.count == 4


def test_walk_finds_small_waiter_far_back_for_backfill() -> None:
    core = make(0.4, 0.0, 0.0)
    core.submit(frac(0.5))  # reserves GPU 0, the most free
    core.submit(whole(3))  # cannot get 3: reservations stop here
    for _ in range(500):
        core.submit(frac(0.9))
    small, _ = core.submit(frac(0.2))
    grants = core.release(1, 300)
    assert [(g.ticket, g.gpus) for g in grants] == [(small, (1,))]


# ----------------------------------------------------------------- cancel and bad input
def test_cancel_of_head_lets_backfill_happen() -> None:
    core = make(0.5, 0.0)
    t1, _ = core.submit(frac(0.6))
    t2, _ = core.submit(frac(0.5))
    assert core.reservations() == {t1: (0,), t2: (1,)}
    grants = core.cancel(t1)
    assert [(g.ticket, g.gpus) for g in grants] == [(t2, (0,))]


def test_cancel_unknown_ticket_raises_keyerror() -> None:
    core = Scheduler(1, policy="reserve-all")
    with pytest.raises(KeyError):
        core.cancel(42)


@pytest.mark.parametrize(
    ("releases", "message"),
    [
        ([(2, 10)], "gpu_id"),
        ([(-1, 10)], "gpu_id"),
        ([(0, 0)], "units to release must be >= 1"),
        ([(0, 600)], "only 500 held"),
        ([(0, 300), (0, 300)], "only 500 held"),
        ([(1, 500)], "only 400 held"),
    ],
)
def test_bad_release_raises_and_changes_nothing(
    releases: list[tuple[int, int]], message: str
) -> None:
    core = make(0.5, 0.6)
    t1, _ = core.submit(frac(0.8))
    before = (core.free, core.reservations())
    with pytest.raises(ValueError, match=message):
        core.release_many(releases)
    assert (core.free, core.reservations()) == before and core.is_waiting(t1)


@pytest.mark.parametrize(("gpu", "units"), [("0", 10), (True, 10), (0, 10.0), (0, True)])
def test_release_of_a_wrong_type_is_a_type_error(gpu: object, units: object) -> None:
    core = make(0.5)
    with pytest.raises(TypeError):
        core.release(gpu, units)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        core.release_many([(gpu, units)])  # type: ignore[list-item]
    assert core.free == (500,)


@pytest.mark.parametrize(
    ("num_gpus", "error"),
    [(0, ValueError), (-1, ValueError), (True, TypeError), (1.0, TypeError), ("2", TypeError)],
)
def test_scheduler_rejects_bad_gpu_count(num_gpus: object, error: type[Exception]) -> None:
    # A wrong type is a TypeError, as everywhere else (Scheduler('2') was a ValueError).
    with pytest.raises(error, match="gpus"):
        Scheduler(num_gpus, policy="reserve-all")  # type: ignore[arg-type]


@pytest.mark.parametrize(("units", "error"), [(0, ValueError), ("10", TypeError)])
def test_scheduler_rejects_bad_units_per_gpu(units: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="units_per_gpu"):
        Scheduler(1, units, policy="reserve-all")  # type: ignore[arg-type]


# ----------------------------------------------------------------- invariants under random use
def reference_reservations(core: Scheduler) -> dict[int, tuple[int, ...]]:
    """Reservations recomputed from scratch by the rule, with no early stop."""
    free = core.free
    unreserved = list(range(core.num_gpus))
    result: dict[int, tuple[int, ...]] = {}
    for w in core.waiters():
        if len(unreserved) < w.demand.count:
            break
        chosen = sorted(unreserved, key=lambda g: (-free[g], g))[: w.demand.count]
        for g in chosen:
            unreserved.remove(g)
        result[w.ticket] = tuple(sorted(chosen))
    return result


def nothing_waiting_fits(core: Scheduler) -> bool:
    """No waiter fits on the GPUs no earlier waiter reserves (the walk left nothing behind)."""
    reserved_before: set[int] = set()
    res = core.reservations()
    free = core.free
    for w in core.waiters():
        fitting = [
            g
            for g in range(core.num_gpus)
            if g not in reserved_before and free[g] >= w.demand.units
        ]
        if len(fitting) >= w.demand.count:
            return False
        reserved_before.update(res.get(w.ticket, ()))
    return True


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = Scheduler(4, units_per_gpu=U, policy="reserve-all")
        self.held: list[tuple[int, int]] = []  # (gpu, units) of live grants
        self.waiting: set[int] = set()
        self.gone: set[int] = set()

    def _absorb(self, grants: list) -> None:  # type: ignore[type-arg]
        for grant in grants:
            assert grant.ticket in self.waiting, "grant to a ticket that is not waiting"
            self.waiting.discard(grant.ticket)
            self.held.extend((g, grant.units) for g in grant.gpus)

    @rule(units=st.integers(1, U))
    def submit_fraction(self, units: int) -> None:
        ticket, grant = self.core.submit(Demand(1, units))
        self.waiting.add(ticket)
        self._absorb([grant] if grant else [])

    @rule(count=st.integers(2, 4))
    def submit_whole(self, count: int) -> None:
        ticket, grant = self.core.submit(Demand(count, U))
        self.waiting.add(ticket)
        self._absorb([grant] if grant else [])

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
        self.gone.add(ticket)
        self._absorb(self.core.cancel(ticket))

    @invariant()
    def capacity_adds_up(self) -> None:
        for gpu in range(4):
            granted = sum(u for g, u in self.held if g == gpu)
            assert 0 <= self.core.free[gpu] <= U
            assert self.core.free[gpu] + granted == U

    @invariant()
    def queue_matches(self) -> None:
        assert {w.ticket for w in self.core.waiters()} == self.waiting
        assert not self.waiting & self.gone

    @invariant()
    def reservations_follow_the_rule(self) -> None:
        res = self.core.reservations()
        assert res == reference_reservations(self.core)
        flat = [g for gpus in res.values() for g in gpus]
        assert len(flat) == len(set(flat))

    @invariant()
    def walk_left_nothing_grantable(self) -> None:
        assert nothing_waiting_fits(self.core)


SchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
TestSchedulerMachine = SchedulerMachine.TestCase


@given(st.lists(st.integers(1, 10), min_size=1, max_size=30))
def test_tenths_always_sum_exactly(tenths: list[int]) -> None:
    core = Scheduler(1, 1_000_000, policy="reserve-all")
    granted = []
    for t in tenths:
        grant = core.grant_now(Demand(1, t * 100_000))
        if grant is not None:
            granted.append(grant)
    for grant in granted:
        core.release(0, grant.units)
    assert core.free == (1_000_000,)


def test_backfill_scan_stops_when_no_waiter_behind_can_fit() -> None:
    core = make(0.4, 0.0, 0.0)
    core.submit(frac(0.5))  # reserves GPU 0
    core.submit(whole(3))  # reservations stop: GPUs 1 and 2 stay open for backfill
    for _ in range(10_000):
        core.submit(frac(0.9))
    visits = count_visits(core)
    assert core.release(1, 200) == []  # 0.2 free on GPU 1 serves nobody behind
    # The head reserves GPU 0, the 3-GPU waiter stops reservations; the first 0.9 waiter is taken
    # from the queue, nothing behind needs less than 0.9 > 0.2 free, and the scan ends.
    assert visits.count == 3
