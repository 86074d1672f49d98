"""The ``easy`` policy with time: learned hold times, the head's shadow, and its bound.

Rules 3e (the head reserves where room comes soonest, and moves at most once), 4e (backfill on
the head's GPUs only if it ends by the shadow, or leaves the head's units), 6e (once the
shadow has passed nothing new lands on the head's GPUs, so it starts when what is there ends)
and 7e (the estimates), then a random state machine with a clock that checks 4e and 6e.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hwpool._core._durations import SMOOTHING, Durations
from hwpool._core._scheduler import Demand, Grant, Scheduler

U = 1_000


def frac(x: float) -> Demand:
    return Demand(1, round(x * U))


def learn(core: Scheduler, demand: Demand, seconds: float) -> None:
    """Run ``demand`` for ``seconds`` on an idle ``core`` so that it learns that hold time."""
    start = core.now
    grant = core.grant_now(demand, now=start)
    assert grant is not None
    core.release_many(core.held(grant), ticket=grant.ticket, now=start + seconds)


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", ["1", object(), [1.0], True])
@pytest.mark.parametrize("call", ["submit", "grant_now"])
def test_now_of_wrong_type_is_a_type_error_changing_nothing(bad: object, call: str) -> None:
    core = Scheduler(2, U)
    with pytest.raises(TypeError, match="now must be a real number"):
        getattr(core, call)(frac(0.5), now=bad)
    assert core.free == (U, U) and core.now == 0.0 and core.queue_length == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_now_not_finite_is_a_value_error(bad: float) -> None:
    core = Scheduler(2, U)
    grant = core.grant_now(frac(0.5), now=1.0)
    assert grant is not None
    with pytest.raises(ValueError, match=r"now must (be finite|not be NaN), got (nan|inf|-inf)"):
        core.release(grant.gpus[0], grant.units, ticket=grant.ticket, now=bad)
    with pytest.raises(ValueError, match=r"now must (be finite|not be NaN)"):
        core.cancel(99, now=bad)
    assert core.free == (U // 2, U) and core.now == 1.0


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (-1.0, ValueError, "expected must be None or a finite number >= 0, got -1.0"),
        (math.nan, ValueError, "expected must not be NaN, got nan"),
        ("5", TypeError, "expected must be a real number, got '5'"),
        (False, TypeError, "expected must be a real number, got False"),
    ],
)
def test_bad_expected_names_the_argument(bad: object, error: type[Exception], message: str) -> None:
    core = Scheduler(2, U)
    with pytest.raises(error, match=message):
        core.submit(frac(0.5), expected=bad)  # type: ignore[arg-type]
    assert core.free == (U, U) and core.queue_length == 0


def test_bad_ticket_on_release_is_a_type_error_changing_nothing() -> None:
    core = Scheduler(1, U)
    core.grant_now(frac(0.5))
    with pytest.raises(TypeError, match="ticket must be an int or None, got '1'"):
        core.release(0, 500, ticket="1")  # type: ignore[arg-type]
    assert core.free == (500,)


def test_the_clock_never_goes_back() -> None:
    core = Scheduler(1, U)
    core.submit(frac(0.2), now=10.0)
    core.submit(frac(0.2), now=4.0)  # an earlier time is taken as the latest one
    assert core.now == 10.0
    learn(core, frac(0.3), 5.0)
    assert core.now == 15.0


# ----------------------------------------------------------------- rule 7e: the estimates
def test_nothing_is_expected_before_any_release() -> None:
    core = Scheduler(2, U)
    assert core.expected(frac(0.5)) is None
    learn(core, frac(0.5), 10.0)
    assert core.expected(frac(0.5)) == 10.0  # one sample: no spread yet


def test_a_class_learns_a_smoothed_mean() -> None:
    core = Scheduler(2, U)
    learn(core, frac(0.5), 10.0)
    learn(core, frac(0.5), 20.0)
    assert core.expected(frac(0.5)) == pytest.approx(10.0 + SMOOTHING * 10.0)
    learn(core, frac(0.5), 0.0)
    assert core.expected(frac(0.5)) == pytest.approx(13.0 * (1 - SMOOTHING))


def test_an_unseen_class_is_judged_by_the_mean_over_all() -> None:
    core = Scheduler(2, U)
    learn(core, frac(0.5), 10.0)
    learn(core, Demand(2, U), 30.0)
    assert core.expected(frac(0.25)) == pytest.approx(20.0)
    assert core.expected(Demand(2, U)) == 30.0


def test_a_release_without_a_ticket_teaches_nothing() -> None:
    core = Scheduler(1, U)
    grant = core.grant_now(frac(0.5), now=0.0)
    assert grant is not None
    core.release(0, 500, now=7.0)
    assert core.expected(frac(0.5)) is None


def test_a_grant_given_back_in_parts_is_learned_once_all_is_back() -> None:
    core = Scheduler(2, U)
    grant = core.grant_now(Demand(2, U), now=0.0)
    assert grant is not None
    core.release(0, U, ticket=grant.ticket, now=3.0)
    assert core.expected(Demand(2, U)) is None
    core.release(1, U, ticket=grant.ticket, now=8.0)
    assert core.expected(Demand(2, U)) == 8.0


def test_an_overdue_run_is_expected_to_go_on_as_long_again() -> None:
    durations = Durations(1)
    durations.start(1, "a", {0: 10}, now=0.0)
    assert durations.end_of(1, now=5.0) == 5.0  # nothing known at all: nothing promised
    durations.start(2, "b", {0: 10}, now=0.0, hint=20.0)
    assert durations.end_of(2, now=5.0) == 20.0  # its hint, not yet past
    assert durations.end_of(2, now=30.0) == 60.0  # past it: as long again
    durations.start(3, "c", {0: 10}, now=30.0)
    durations.finish(3, 0, 10, now=34.0)  # "c" takes 4 s: the mean over all is 4
    assert durations.end_of(1, now=35.0) == 35.0 + 35.0  # "a" unknown, overdue on that mean
    durations.start(4, "a", {0: 10}, now=35.0)
    assert durations.end_of(4, now=36.0) == 39.0  # start + the mean over all


# ----------------------------------------------------------------- rule 3e: the head's GPUs
def test_p2_the_head_reserves_the_gpus_that_drain_first() -> None:
    """GPUs 2-3 are the most free but run long work; 0-1 drain soon: a 2-GPU head takes 0-1."""
    core = Scheduler(4, U)
    for _ in range(2):
        assert core.grant_now(Demand(1, U), now=0.0, expected=2.0) is not None  # GPUs 0, 1
    assert core.grant_now(frac(0.1), now=0.0, expected=300.0) is not None  # GPU 2
    filler = core.grant_now(frac(0.9), now=0.0, expected=1.0)  # fills GPU 2 for a moment
    assert core.grant_now(frac(0.1), now=0.0, expected=300.0) is not None  # so GPU 3
    assert filler is not None and filler.gpus == (2,)
    core.release(2, filler.units, ticket=filler.ticket, now=0.5)
    assert core.free == (0, 0, 900, 900)
    ticket, grant = core.submit(Demand(2, U), now=0.5)
    assert grant is None
    assert core.head == (ticket, (0, 1), 2.0, 0.5, False)
    old = Scheduler(4, U, policy="reserve-all")  # rule 3: the most free, whatever they run
    for demand in (Demand(1, U), Demand(1, U), frac(0.1), frac(0.1)):
        old.submit(demand)
    assert old.submit(Demand(2, U))[1] is None
    assert list(old.reservations().values()) == [(2, 3)]


def test_without_estimates_the_head_reserves_the_most_free_gpu() -> None:
    core = Scheduler(3, U)
    for x in (0.5, 0.8, 0.6):
        core.submit(frac(x))
    ticket, _ = core.submit(frac(0.7))
    assert core.reservations() == {ticket: (0,)}


def moved_head() -> tuple[Scheduler, int]:
    """A 0.5 head on GPU 1 (expected to drain at 10), while GPU 0 drains at 15."""
    core = Scheduler(2, U)
    for _ in range(2):
        assert core.grant_now(frac(0.35), now=0.0, expected=15.0) is not None  # GPU 0
    assert core.grant_now(frac(0.6), now=0.0, expected=10.0) is not None  # GPU 1
    assert core.free == (300, 400)
    ticket, _ = core.submit(frac(0.5), now=0.0)
    assert core.head == (ticket, (1,), 10.0, 0.0, False)
    return core, ticket


def test_an_overdue_head_moves_once_to_gpus_that_drain_sooner() -> None:
    core, ticket = moved_head()
    # Before the shadow nothing moves.
    poke(core, 9.0)
    assert core.head == (ticket, (1,), 10.0, 0.0, False)
    # At 12, GPU 1's work is overdue: expected to go on as long again (to 24); GPU 0 at 15.
    poke(core, 12.0)
    assert core.head == (ticket, (0,), 15.0, 0.0, True)


def poke(core: Scheduler, now: float) -> None:
    """Make the core walk its queue at ``now`` (a request that waits, withdrawn)."""
    ticket, grant = core.submit(Demand(core.num_gpus, U), now=now)
    assert grant is None
    core.cancel(ticket, now=now)


def test_an_overdue_head_stays_where_no_other_gpu_drains_sooner() -> None:
    core = Scheduler(2, U)
    parts = [core.grant_now(frac(x), now=0.0, expected=10.0) for x in (0.45, 0.1, 0.1)]
    assert [p.gpus for p in parts if p] == [(0,), (0,), (0,)]
    assert core.grant_now(frac(0.6), now=0.0, expected=10.0) is not None  # GPU 1
    assert core.free == (350, 400)
    ticket, _ = core.submit(frac(0.5), now=0.0)
    assert core.head == (ticket, (1,), 10.0, 0.0, False)  # ties: the most free
    small = parts[1]
    assert small is not None
    assert core.release(0, small.units, ticket=small.ticket, now=11.0) == []
    assert core.free == (450, 400)  # GPU 0 is now the most free, but drains no sooner
    poke(core, 12.0)
    assert core.head == (ticket, (1,), 10.0, 0.0, False)


def test_a_head_moves_no_more_than_once() -> None:
    core = Scheduler(4, U)
    running = [core.grant_now(Demand(1, U), now=0.0, expected=e) for e in (10, 10, 20, 20)]
    assert [g.gpus for g in running if g] == [(0,), (1,), (2,), (3,)]
    ticket, _ = core.submit(Demand(2, U), now=0.0)
    assert core.head == (ticket, (0, 1), 10.0, 0.0, False)
    poke(core, 12.0)  # 0-1 overdue (to 24): 2-3 drain sooner (20)
    assert core.head == (ticket, (2, 3), 20.0, 0.0, True)
    for gpu in (0, 1):  # 0-1 are given back one by one, and backfilled with 10 s runs
        grant = running[gpu]
        assert grant is not None
        assert core.release(gpu, U, ticket=grant.ticket, now=13.0) == []
        assert core.grant_now(Demand(1, U), now=13.0, expected=10.0) is not None
    poke(core, 21.0)  # 2-3 overdue (to 42), 0-1 expected at 23: it would move, but has moved
    assert core.head == (ticket, (2, 3), 20.0, 0.0, True)


def test_rule_5e_the_head_takes_room_wherever_it_appears_first() -> None:
    core = Scheduler(2, U)
    first = core.grant_now(frac(0.6), now=0.0, expected=10.0)  # GPU 0
    second = core.grant_now(frac(0.7), now=0.0, expected=20.0)  # GPU 1
    assert first is not None and second is not None
    ticket, _ = core.submit(frac(0.5), now=0.0)
    assert core.head is not None and core.head.gpus == (0,)  # drains first
    grants = core.release(1, 700, ticket=second.ticket, now=1.0)  # GPU 1 empties instead
    assert grants == [(ticket, (1,), 500)] and core.head is None


# ----------------------------------------------------------------- rule 4e: backfill by time
def shadowed_core(backfill: str = "limits") -> tuple[Scheduler, int, Grant]:
    """One GPU 0.6 busy with work learned to take 10 s; a whole-GPU head with shadow 10."""
    core = Scheduler(1, U, backfill=backfill)
    learn(core, frac(0.6), 10.0)
    learn(core, frac(0.1), 4.0)
    learn(core, frac(0.2), 30.0)
    start = core.now
    running = core.grant_now(frac(0.6), now=start)
    assert running is not None
    ticket, grant = core.submit(Demand(1, U), now=start)
    assert grant is None and core.head is not None
    assert core.head.shadow == start + 10.0
    return core, ticket, running


def limited(fraction: float, limit: float) -> Demand:
    """A fractional demand whose caller enforces ``limit`` seconds of hold."""
    return replace(frac(fraction), limit=limit)


def test_backfill_whose_limit_ends_by_the_shadow_goes_on_the_heads_gpu() -> None:
    core, _, _ = shadowed_core()
    start = core.now
    assert core.grant_now(limited(0.1, 4.0), now=start + 1.0) is not None  # ends by +5
    assert core.grant_now(limited(0.1, 9.0), now=start + 1.0) is not None  # by +10


def test_backfill_without_a_limit_stays_off_the_heads_gpus() -> None:
    """Rule 4e: a learned hold time (4 s, well before the shadow) is no bound: work that
    holds longer than it did before would delay the head without limit."""
    core, _, _ = shadowed_core()
    assert core.grant_now(frac(0.1), now=core.now + 1.0) is None
    assert core.grant_now(limited(0.1, 9.5), now=core.now + 1.0) is None  # past +10


def test_backfill_that_would_delay_the_head_waits() -> None:
    core, _, _ = shadowed_core()
    assert core.grant_now(frac(0.2), now=core.now) is None  # 30 s: past the shadow
    assert core.grant_now(frac(0.1), now=core.now + 7.0) is None  # 4 s from +7 ends at +11


def test_a_hint_lets_nothing_onto_the_heads_gpus() -> None:
    """The liar of issue 23: a hint is not enforced, so it passes nobody."""
    core, _, _ = shadowed_core()
    assert core.grant_now(frac(0.2), now=core.now, expected=0.01) is None
    assert core.grant_now(limited(0.2, 3.0), now=core.now, expected=0.01) is not None


def test_once_the_shadow_has_passed_nothing_lands_on_the_heads_gpus() -> None:
    core, _, _ = shadowed_core()
    assert core.head is not None
    shadow = core.head.shadow
    assert core.grant_now(frac(0.1), now=shadow, expected=0.0) is None  # the guard (6e)


def test_a_fractional_head_leaves_room_for_backfill_that_keeps_its_units() -> None:
    core = Scheduler(1, U)
    assert core.grant_now(limited(0.5, 10.0), now=0.0) is not None
    assert core.grant_now(frac(0.3), now=0.0, expected=1e9) is not None  # 0.2 free
    ticket, _ = core.submit(frac(0.6), now=0.0)  # fits once the 0.5 ends, at 10
    assert core.head == (ticket, (0,), 10.0, 0.0, False)
    # At the shadow 0.7 is surely free: a 0.1 for ever leaves the head's 0.6; a second not.
    assert core.grant_now(frac(0.1), now=1.0, expected=1e9) is not None
    assert core.grant_now(frac(0.1), now=1.0, expected=1e9) is None
    assert core.grant_now(limited(0.1, 9.0), now=1.0) is not None  # ends by 10


def test_the_slack_counts_only_what_limits_end() -> None:
    """A fractional head's slack (rule 4e) counts on no estimate: the 0.5 expected (hinted)
    to end by the shadow may hold on, so only what is free now is left to share."""
    core = Scheduler(1, U)
    assert core.grant_now(frac(0.5), now=0.0, expected=10.0) is not None
    assert core.grant_now(frac(0.3), now=0.0, expected=1e9) is not None  # 0.2 free
    core.submit(frac(0.6), now=0.0)
    assert core.grant_now(frac(0.1), now=1.0, expected=1e9) is None


def test_a_limited_waiter_may_pass_an_earlier_one_of_its_size() -> None:
    core, _, _ = shadowed_core()
    slow, grant = core.submit(frac(0.2), now=core.now)
    assert grant is None
    _, grant = core.submit(frac(0.2), now=core.now, expected=1.0)
    assert grant is None  # a hint is no bound: it waits behind the earlier one
    _, grant = core.submit(limited(0.2, 1.0), now=core.now)
    assert grant is not None and core.is_waiting(slow)


def test_without_a_hint_a_new_arrival_never_passes_its_own_demand() -> None:
    core, _, _ = shadowed_core()
    first, grant = core.submit(frac(0.2), now=core.now)
    assert grant is None
    second, grant = core.submit(frac(0.2), now=core.now)
    assert grant is None
    assert [w.ticket for w in core.waiters()][1:] == [first, second]


def test_the_head_starts_when_its_gpus_empty() -> None:
    core, head, running = shadowed_core()
    backfill = core.grant_now(limited(0.1, 4.0), now=core.now + 1.0)
    assert backfill is not None
    later = core.now + 20.0
    assert core.release(0, running.units, ticket=running.ticket, now=later) == []
    grants = core.release(0, backfill.units, ticket=backfill.ticket, now=later)
    assert [g.ticket for g in grants] == [head]


# ----------------------------------------------------------------- the state machine
class TimedEasyMachine(RuleBasedStateMachine):
    """Random submits (some with hints), releases and cancels on a clock that moves forward.

    Checks, after every step: capacity adds up; only the first waiter reserves; a backfill
    (a grant to a ticket behind the head) lands on the head's GPUs only before its shadow
    (4e, 6e); and giving back just what runs on the head's GPUs grants the head (6e).
    """

    def __init__(self) -> None:
        super().__init__()
        self.core = Scheduler(3, units_per_gpu=U)
        self.now = 0.0
        self.live: dict[int, Grant] = {}
        self.waiting: set[int] = set()
        self.heads: dict[int, tuple[int, ...]] = {}  # head ticket -> the GPUs it first had

    def _absorb(self, grants: list[Grant]) -> None:
        head = self.core.head
        for grant in grants:
            assert grant.ticket in self.waiting
            self.waiting.discard(grant.ticket)
            self.live[grant.ticket] = grant
            behind = head is not None and grant.ticket > head.ticket
            if behind and head is not None and not set(grant.gpus).isdisjoint(head.gpus):
                assert self.now < head.shadow, "backfill on the head's GPUs past its shadow"

    @rule(
        units=st.sampled_from([100, 250, 500, 600, U]),
        hint=st.one_of(st.none(), st.floats(0, 50)),
        step=st.floats(0, 5),
    )
    def submit_fraction(self, units: int, hint: float | None, step: float) -> None:
        self.now += step
        ticket, grant = self.core.submit(Demand(1, units), now=self.now, expected=hint)
        self.waiting.add(ticket)
        self._absorb([grant] if grant else [])

    @rule(count=st.integers(2, 3), step=st.floats(0, 5))
    def submit_whole(self, count: int, step: float) -> None:
        self.now += step
        ticket, grant = self.core.submit(Demand(count, U), now=self.now)
        self.waiting.add(ticket)
        self._absorb([grant] if grant else [])

    @precondition(lambda self: self.live)
    @rule(data=st.data(), step=st.floats(0, 20))
    def release(self, data: st.DataObject, step: float) -> None:
        self.now += step
        ticket = data.draw(st.sampled_from(sorted(self.live)))
        grant = self.live.pop(ticket)
        self._absorb(self.core.release_many(self.core.held(grant), ticket=ticket, now=self.now))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), step=st.floats(0, 5))
    def cancel(self, data: st.DataObject, step: float) -> None:
        self.now += step
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(ticket)
        self._absorb(self.core.cancel(ticket, now=self.now))

    @invariant()
    def capacity_adds_up(self) -> None:
        for gpu in range(3):
            held = sum(g.units for g in self.live.values() if gpu in g.gpus)
            assert self.core.free[gpu] + held == U

    @invariant()
    def only_the_first_waiter_reserves(self) -> None:
        waiters = [w.ticket for w in self.core.waiters()]
        assert set(waiters) == self.waiting
        head = self.core.head
        assert (head is None) == (not waiters)
        if head is not None:
            assert head.ticket == waiters[0]
            assert self.core.reservations() == {head.ticket: head.gpus}

    @invariant()
    def a_head_moves_at_most_once_and_only_past_its_shadow(self) -> None:
        head = self.core.head
        if head is None:
            return
        first = self.heads.setdefault(head.ticket, head.gpus)
        assert head.moved == (head.gpus != first) or (head.moved and head.gpus != first)
        if not head.moved:
            assert head.gpus == first

    @invariant()
    def the_head_starts_once_its_gpus_are_given_back(self) -> None:
        """From its shadow on, nothing new lands on the head's GPUs: once what runs there
        now is given back (at once, at the shadow or later), the head is granted."""
        head = self.core.head
        if head is None:
            return
        core = copy.deepcopy(self.core)
        there = [g for g in self.live.values() if not set(g.gpus).isdisjoint(head.gpus)]
        pairs = [pair for grant in there for pair in core.held(grant)]
        granted = core.release_many(pairs, now=max(self.now, head.shadow)) if pairs else []
        assert head.ticket in [g.ticket for g in granted]


TimedEasyMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestTimedEasyMachine = TimedEasyMachine.TestCase


def test_backfill_by_estimates_trusts_hints_and_what_was_learned() -> None:
    """``backfill="estimates"``: the EASY of before issue 23, for one program's own work: an
    expected hold (learned: 4 s; hinted: 3 s) ending by the shadow goes onto the head's GPU,
    one past it does not, and a limit caps a longer estimate."""
    core, _, _ = shadowed_core(backfill="estimates")
    start = core.now
    assert core.grant_now(frac(0.1), now=start + 1.0) is not None
    assert core.grant_now(frac(0.2), now=start, expected=60.0) is None
    assert core.grant_now(frac(0.2), now=start, expected=3.0) is not None
    assert core.grant_now(limited(0.1, 2.0), now=start, expected=60.0) is not None


@pytest.mark.parametrize("backfill", ["", "Limits", None, 1])
def test_a_bad_backfill_is_refused_by_name(backfill: object) -> None:
    with pytest.raises(
        ValueError, match=f"backfill must be one of limits, estimates; got {backfill!r}"
    ):
        Scheduler(1, U, backfill=backfill)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [0, -1.0, math.inf, math.nan])
def test_a_bad_limit_is_refused_by_name_and_changes_nothing(limit: float) -> None:
    core = Scheduler(1, U)
    with pytest.raises(
        ValueError, match=r"limit must (be a finite number of seconds > 0|not be NaN)"
    ):
        core.submit(limited(0.5, limit), now=1.0)
    with pytest.raises(TypeError, match="limit"):
        core.submit(replace(frac(0.5), limit="9"), now=1.0)  # type: ignore[arg-type]
    assert core.free == (U,) and core.queue_length == 0 and core.now == 0.0
