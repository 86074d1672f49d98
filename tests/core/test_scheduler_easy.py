"""The ``easy`` policy of the core (the default): only the head reserves, and keeps its GPUs.

Each rule (3e, 4e), flaw P1 and P3 of issue 9, and the invariants of the random state machine
that still hold under it; the simulator traces are in tests/sim/test_sim_easy.py.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import initialize, invariant
from test_scheduler import SchedulerMachine
from test_scheduler_totals import TotalsMachine, fits, need, totals_strategy

from hwpool._core._scheduler import POLICIES, Demand, Scheduler

U = 1_000  # 1.0 GPU == 1000 units, as in test_scheduler


def frac(x: float) -> Demand:
    return Demand(1, round(x * U))


def test_default_policy_is_easy() -> None:
    assert POLICIES == ("easy", "reserve-all")
    assert Scheduler(2, U).policy == "easy"
    assert Scheduler(2, U, policy="reserve-all").policy == "reserve-all"


@pytest.mark.parametrize("bad", ["EASY", "", "fifo", "reserve_all"])
def test_unknown_policy_is_a_value_error_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=f"policy must be one of easy, reserve-all; got {bad!r}"):
        Scheduler(2, U, policy=bad)


@pytest.mark.parametrize("bad", [None, 1, b"easy"])
def test_policy_of_wrong_type_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="policy must be a str"):
        Scheduler(2, U, policy=bad)  # type: ignore[arg-type]


def p1_core(policy: str) -> Scheduler:
    """Four GPUs each 0.6 busy, four whole-GPU waiters queued: what a 0.1 request gets."""
    core = Scheduler(4, U, policy=policy)
    for _ in range(4):
        assert core.submit(frac(0.6))[1] is not None
    for _ in range(4):
        assert core.submit(Demand(1, U))[1] is None
    return core


def test_p1_easy_backfills_beside_the_head() -> None:
    core = p1_core("easy")
    # Only the head reserves: the most free GPU, lowest index.
    assert core.reservations() == {5: (0,)}
    placed = []
    for _ in range(12):
        _, grant = core.submit(frac(0.1))
        assert grant is not None
        placed.append(grant.gpus)
    assert sorted(placed) == [(1,)] * 4 + [(2,)] * 4 + [(3,)] * 4
    assert core.submit(frac(0.1))[1] is None  # GPUs 1-3 full; GPU 0 stays the head's
    assert core.grant_now(frac(0.1)) is None
    assert core.free == (400, 0, 0, 0)


def test_p1_reserve_all_blocks_the_same_requests() -> None:
    core = p1_core("reserve-all")
    assert core.reservations() == {5: (0,), 6: (1,), 7: (2,), 8: (3,)}
    assert core.submit(frac(0.1))[1] is None
    assert core.grant_now(frac(0.1)) is None


def test_p1_easy_whole_gpu_waiters_start_when_the_big_tasks_end() -> None:
    core = p1_core("easy")
    for _ in range(12):
        assert core.submit(frac(0.1))[1] is not None
    # The 0.1 tasks end first: nothing waiting fits on 0.4 of a GPU.
    for gpu in (1, 2, 3):
        for _ in range(4):
            assert core.release(gpu, 100) == []
    # Then each 0.6 task ends: every whole-GPU waiter starts as soon as its GPU is empty,
    # each new head reserving the next GPU.
    started = []
    for gpu in range(4):
        started += [(g.ticket, g.gpus) for g in core.release(gpu, 600)]
        assert core.queue_length == 3 - gpu
    assert started == [(5, (0,)), (6, (1,)), (7, (2,)), (8, (3,))]


def test_p3_the_head_keeps_its_gpus_when_another_becomes_freer() -> None:
    for policy, expected in (("reserve-all", (1,)), ("easy", (0,))):
        core = Scheduler(2, U, policy=policy)
        core.restore((0,), 500)
        core.restore((1,), 300)
        core.restore((1,), 300)
        ticket, grant = core.submit(Demand(1, U))
        assert grant is None
        assert core.reservations() == {ticket: (0,)}  # 0.5 free against 0.4
        assert core.release(1, 300) == []  # GPU 1 now 0.7 free, more than GPU 0
        assert core.reservations() == {ticket: expected}, policy
    # Under easy the GPU it did not hop to is the one that backfills.
    grant = core.grant_now(frac(0.6))
    assert grant is not None and grant.gpus == (1,)
    assert [g.gpus for g in core.release(0, 500)] == [(0,)]


def test_easy_head_never_passed_over_on_its_gpus() -> None:
    """A stream of small requests never lands on the head's GPU; the head starts the moment
    the grant there ends."""
    core = Scheduler(2, U, policy="easy")
    core.restore((0,), 600)
    core.restore((1,), 600)
    head, _ = core.submit(Demand(1, U))
    assert core.reservations() == {head: (0,)}
    live: list[int] = []
    for step in range(200):
        ticket, grant = core.submit(frac(0.3))
        if grant is not None:
            assert grant.gpus == (1,), step
            live.append(ticket)
        else:
            assert core.cancel(ticket) == []
        if step % 2 and live:
            live.pop()
            assert core.release(1, 300) == []
        assert core.reservations() == {head: (0,)}
    grants = core.release(0, 600)
    assert [(g.ticket, g.gpus) for g in grants] == [(head, (0,))]


def test_easy_new_head_chooses_afresh() -> None:
    core = Scheduler(2, U, policy="easy")
    core.restore((0,), 500)
    core.restore((1,), 600)
    first, _ = core.submit(Demand(1, U))
    second, _ = core.submit(Demand(1, U))
    assert core.reservations() == {first: (0,)}
    assert core.cancel(first) == []
    assert core.reservations() == {second: (0,)}
    assert core.release(1, 600) == [(second, (1,), U)]
    assert core.reservations() == {}


def test_easy_gpus_of_different_sizes() -> None:
    core = Scheduler([100, 40, 40], policy="easy")
    core.restore((0,), 70)
    core.restore((1,), 30)
    core.restore((2,), 30)
    big, grant = core.submit(Demand(1, 90))
    assert grant is None
    assert core.reservations() == {big: (0,)}  # the only GPU that could ever hold it
    grant = core.grant_now(Demand(1, 10))
    assert grant is not None and grant.gpus == (1,)
    assert core.release(0, 70) == [(big, (0,), 90)]


# ----------------------------------------------------------------- invariants under random use
def check_head_reservation(
    core: Scheduler, last: tuple[int, tuple[int, ...]] | None
) -> tuple[int, tuple[int, ...]] | None:
    """Only the head reserves, GPUs that could hold it, the same ones as at the last check
    while it stays the head (no hopping). Returns what to compare with next time."""
    res = core.reservations()
    head = next(iter(core.waiters()), None)
    if head is None:
        assert res == {}
        return None
    assert list(res) == [head.ticket]
    gpus = res[head.ticket]
    assert len(gpus) == head.demand.count == len(set(gpus))
    if not (head.demand.whole or head.demand.count > 1):
        assert all(core.totals[g] >= need(core, head.demand, g) for g in gpus)
    if last is not None and last[0] == head.ticket:
        assert gpus == last[1], "the head's reservation hopped"
    return head.ticket, gpus


def check_nothing_left_grantable(core: Scheduler) -> None:
    """The head fits nowhere; no other waiter fits on a GPU the head does not reserve."""
    waiters = list(core.waiters())
    reserved = set(core.reservations().get(waiters[0].ticket, ())) if waiters else set()
    for i, w in enumerate(waiters):
        gpus = [g for g in range(core.num_gpus) if i == 0 or g not in reserved]
        assert not fits(core, w.demand, gpus), f"waiter {w.ticket} fits"


class EasyMachine(SchedulerMachine):
    """The random state machine of test_scheduler on ``policy="easy"``; the reservation
    invariants are those of rules 3e/4e instead of rule 3."""

    def __init__(self) -> None:
        super().__init__()
        self.core = Scheduler(4, units_per_gpu=U, policy="easy")
        self.last_head: tuple[int, tuple[int, ...]] | None = None

    @invariant()
    def reservations_follow_the_rule(self) -> None:
        self.last_head = check_head_reservation(self.core, self.last_head)

    @invariant()
    def walk_left_nothing_grantable(self) -> None:
        check_nothing_left_grantable(self.core)


EasyMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40)
TestEasyMachine = EasyMachine.TestCase


class EasyTotalsMachine(TotalsMachine):
    """test_scheduler_totals' machine (GPUs of different sizes, whole GPUs of any size) on
    ``policy="easy"``: conservation and the head not starving as there, rules 3e/4e here."""

    @initialize(totals=totals_strategy)
    def start(self, totals: list[int]) -> None:
        super().start(totals)
        self.core = Scheduler(totals, policy="easy")
        self.last_head: tuple[int, tuple[int, ...]] | None = None

    @invariant()
    def reservations_follow_the_rule_and_are_disjoint(self) -> None:
        assert {w.ticket for w in self.core.waiters()} == self.waiting
        self.last_head = check_head_reservation(self.core, self.last_head)

    @invariant()
    def walk_left_nothing_grantable(self) -> None:
        check_nothing_left_grantable(self.core)


EasyTotalsMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestEasyTotalsMachine = EasyTotalsMachine.TestCase
