"""Owners, shares and priorities in the core (issue 23; rules 8-10 of the scheduler).

One owner at one priority must decide exactly as the core did before owners: a hypothesis
test drives a frozen copy of that core (``_frozen_scheduler``) and this one with the same
inputs and compares every answer. Then the fair order between owners, priorities within an
owner, the bounded head, usage and its decay, and bad inputs.
"""

from __future__ import annotations

import math
from typing import Any

import _frozen_scheduler as frozen
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hwpool._core._fairshare import Usage
from hwpool._core._scheduler import Demand, Grant, Scheduler

U = 1_000

# One input: ("submit" | "grant_now", count, units, whole, relative, expected, dt),
# ("release", pick, ticketed, dt) or ("cancel", pick, dt).
_dts = st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0, 10.0])
_submit = st.tuples(
    st.sampled_from(["submit", "submit", "grant_now"]),
    st.integers(1, 3),
    st.sampled_from([100, 250, 300, 500, 700, 1000]),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from([0.5, 2.0, 20.0])),
    _dts,
)
_release = st.tuples(st.just("release"), st.integers(0, 50), st.booleans(), _dts)
_cancel = st.tuples(st.just("cancel"), st.integers(0, 50), _dts)
_ops = st.lists(st.one_of(_submit, _submit, _submit, _release, _release, _cancel), max_size=80)


def _demands(op: tuple[Any, ...], totals: list[int], owner: object, priority: int) -> Any:
    """The same demand for the frozen core and for this one (None: not a valid one)."""
    _, count, units, whole, relative, _, _ = op
    count = min(count, len(totals))
    if relative:
        count, whole = 1, False
    units = min(units, max(totals))
    if count > 1 or whole:
        units = max(totals) if len(set(totals)) > 1 else totals[0]
    old = frozen.Demand(count, units, whole=whole, relative=relative)
    new = Demand(count, units, whole=whole, relative=relative, owner=owner, priority=priority)
    return old, new


def _drive(
    old: Any, new: Scheduler, ops: list[tuple[Any, ...]], owner: object, priority: int
) -> None:
    totals = list(new.totals)
    held: list[Grant] = []
    now = 0.0
    for op in ops:
        now += op[-1]
        if op[0] in ("submit", "grant_now"):
            a, b = _demands(op, totals, owner, priority)
            if op[0] == "submit":
                got_old = old.submit(a, now=now, expected=op[5])
                got_new = new.submit(b, now=now, expected=op[5])
                assert got_old == got_new
                grant = got_new[1]
            else:
                got_old = old.grant_now(a, now=now, expected=op[5])
                grant = new.grant_now(b, now=now, expected=op[5])
                assert got_old == grant
            if grant is not None:
                held.append(grant)
        elif op[0] == "release" and held:
            grant = held.pop(op[1] % len(held))
            ticket = grant.ticket if op[2] else None
            parts = new.held(grant)
            got = old.release_many(parts, ticket=ticket, now=now)
            assert got == new.release_many(parts, ticket=ticket, now=now)
            held.extend(got)
        elif op[0] == "cancel" and new.queue_length:
            waiting = [w.ticket for w in new.waiters()]
            ticket = waiting[op[1] % len(waiting)]
            got = old.cancel(ticket, now=now)
            assert got == new.cancel(ticket, now=now)
            held.extend(got)
        assert old.free == new.free
        assert old.reservations() == new.reservations()
        assert old.head == new.head
        assert [w.ticket for w in old.waiters()] == [w.ticket for w in new.waiters()]


@settings(max_examples=300, deadline=None)
@given(
    ops=_ops,
    policy=st.sampled_from(["easy", "reserve-all"]),
    totals=st.sampled_from([[U], [U] * 2, [U] * 3, [U, 500, 2 * U]]),
    owner=st.sampled_from([None, "team-a", 7]),
    priority=st.sampled_from([0, 0, 3, -2]),
)
def test_one_owner_decides_exactly_as_before_owners(
    ops: list[tuple[Any, ...]], policy: str, totals: list[int], owner: object, priority: int
) -> None:
    old = frozen.Scheduler(totals, policy=policy)
    new = Scheduler(totals, policy=policy, shares={"team-b": 3.0}, half_life=60.0)
    _drive(old, new, ops, owner, priority)


# ----------------------------------------------------------------- the fair order (rule 9)
def _busy(core: Scheduler, owner: object, now: float = 0.0) -> Grant:
    """``owner`` takes the whole of a one-GPU core."""
    _, grant = core.submit(Demand(1, U, owner=owner), now=now)
    assert grant is not None
    return grant


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_an_owner_with_less_usage_is_served_first(policy: str) -> None:
    core = Scheduler(1, U, policy=policy)
    held = _busy(core, "a")
    early = [core.submit(Demand(1, U, owner="a"), now=1.0)[0] for _ in range(3)]
    late = core.submit(Demand(1, U, owner="b"), now=2.0)[0]
    assert [w.ticket for w in core.waiters()] == [late, *early]
    (grant,) = core.release(0, U, ticket=held.ticket, now=10.0)
    assert grant.ticket == late
    assert core.usage("a", 10.0) > 0.0 == core.usage("b", 10.0)


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_shares_divide_usage(policy: str) -> None:
    core = Scheduler(2, U, policy=policy, shares={"big": 4.0})
    big, _ = _busy_two(core, "big", "small")
    waiting = {o: core.submit(Demand(1, U, owner=o), now=5.0)[0] for o in ("small", "big")}
    # Equal usage (one GPU each for 10 s), but big has four times the share.
    (grant,) = core.release(0, U, ticket=big.ticket, now=10.0)
    assert grant.ticket == waiting["big"]
    assert core.usage("big", 10.0) == pytest.approx(core.usage("small", 10.0))


def _busy_two(core: Scheduler, first: object, second: object) -> tuple[Grant, Grant]:
    _, one = core.submit(Demand(1, U, owner=first), now=0.0)
    _, two = core.submit(Demand(1, U, owner=second), now=0.0)
    assert one is not None and two is not None
    return one, two


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_priority_reorders_an_owners_own_queue_only(policy: str) -> None:
    core = Scheduler(1, U, policy=policy)
    held = _busy(core, "a")
    other = core.submit(Demand(1, U, owner="b"), now=1.0)[0]
    low = core.submit(Demand(1, U, owner="a"), now=1.0)[0]
    high = core.submit(Demand(1, U, owner="a", priority=5), now=1.0)[0]
    # b has used nothing: first; a's priority reorders a's queue, never passes b.
    assert [w.ticket for w in core.waiters()] == [other, high, low]
    order = []
    grant = held
    for _ in range(3):
        (grant,) = core.release(0, U, ticket=grant.ticket, now=core.now + 1.0)
        order.append(grant.ticket)
    assert order == [other, high, low]


def test_usage_is_decayed_gpu_seconds() -> None:
    core = Scheduler(2, U, half_life=10.0)
    _, half = core.submit(Demand(1, U // 2, owner="a"), now=0.0)
    assert half is not None
    core.release(half.gpus[0], U // 2, ticket=half.ticket, now=10.0)
    # Half a GPU for 10 s, decayed with a 10 s half-life: 0.5 * 10 / ln 2 * (1 - 1/2).
    expected = 0.5 * 10.0 / math.log(2.0) * 0.5
    assert core.usage("a", 10.0) == pytest.approx(expected)
    assert core.usage("a", 20.0) == pytest.approx(expected / 2)
    assert core.usage("nobody") == 0.0


def test_one_owner_alone_gets_every_gpu() -> None:
    core = Scheduler(4, U)
    grants = [core.submit(Demand(1, U, owner="a"), now=0.0)[1] for _ in range(4)]
    assert all(grants)
    assert core.free == (0, 0, 0, 0)


def _flood(count: int, units: int, owners: bool, policy: str, a_owner: str | None = "a") -> float:
    """A queues 40 one-GPU 10 s jobs on 4 GPUs, B one job at t=1: B's wait."""
    core = Scheduler(4, U, policy=policy)
    a, b = (a_owner, "b") if owners else (None, None)
    running: list[tuple[float, Grant]] = []
    for _ in range(40):
        _, grant = core.submit(Demand(1, U, owner=a), now=0.0)
        if grant is not None:
            running.append((10.0, grant))
    mine, _ = core.submit(Demand(count, units, owner=b), now=1.0)
    while running:
        running.sort(key=lambda item: item[0])
        end, grant = running.pop(0)
        for new in core.release_many(core.held(grant), ticket=grant.ticket, now=end):
            if new.ticket == mine:
                return end - 1.0
            running.append((end + 10.0, new))
    raise AssertionError("B was never granted")


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
@pytest.mark.parametrize(("count", "units"), [(4, U), (2, U), (1, U), (1, U // 4)])
def test_a_flood_delays_another_owner_one_hold_time(policy: str, count: int, units: int) -> None:
    assert _flood(count, units, owners=False, policy=policy) == 99.0  # last in line
    assert _flood(count, units, owners=True, policy=policy) == 9.0  # the next release


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_the_default_owner_is_counted_from_when_another_appears(policy: str) -> None:
    # A names no owner: nothing is counted until B's demand names one; then A's running
    # grants count from their start, and B still goes first.
    assert _flood(4, U, owners=True, policy=policy, a_owner=None) == 9.0
    core = Scheduler(1, U, policy=policy, half_life=1e9)
    _, grant = core.submit(Demand(1, U), now=0.0)
    assert grant is not None
    core.submit(Demand(1, U, owner="b"), now=4.0)
    assert core.usage(None, 4.0) == pytest.approx(4.0, rel=1e-6)
    assert core.running(None) == 1.0


def test_a_head_yields_once_then_comes_back() -> None:
    core = Scheduler(2, U)
    held = [_grant for _grant in (core.submit(Demand(1, U, owner="a"), now=0.0)[1],) if _grant]
    held.append(core.submit(Demand(1, U, owner="a"), now=0.0)[1])  # type: ignore[arg-type]
    first = core.submit(Demand(1, U, owner="a"), now=1.0)[0]
    assert core.head is not None and core.head.ticket == first
    wide = core.submit(Demand(2, U, owner="b"), now=2.0)[0]
    assert core.head is not None and core.head.ticket == wide  # b has used less: a yields
    third = core.submit(Demand(1, U, owner="c"), now=3.0)[0]
    assert core.head.ticket == wide  # only one yield at a time
    grants = core.release(0, U, ticket=held[0].ticket, now=10.0)
    assert grants == []  # GPU 0 is kept for the wide head
    (grant,) = core.release(1, U, ticket=held[1].ticket, now=10.0)
    assert grant.ticket == wide
    assert core.head is not None and core.head.ticket == first  # back, ahead of c
    assert third in {w.ticket for w in core.waiters()}


# ----------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("shares", "error", "match"),
    [
        ([("a", 1.0)], TypeError, "shares must be a mapping"),
        ({"a": 0}, ValueError, r"shares\['a'\] must be a finite number > 0, got 0"),
        ({"a": -1.5}, ValueError, r"shares\['a'\] must be a finite number > 0, got -1.5"),
        ({"a": math.inf}, ValueError, r"shares\['a'\] must be a finite number > 0"),
        ({"a": math.nan}, ValueError, r"shares\['a'\] must not be NaN"),
        ({"a": "1"}, TypeError, r"shares\['a'\] must be a real number, got '1'"),
        ({"a": True}, TypeError, r"shares\['a'\] must be a real number, got True"),
    ],
)
def test_bad_shares_name_the_owner_and_value(shares: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Scheduler(2, U, shares=shares)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("half_life", "error", "match"),
    [
        (0, ValueError, "half_life must be a finite number of seconds > 0, got 0"),
        (-3.0, ValueError, "half_life must be a finite number of seconds > 0, got -3.0"),
        (math.inf, ValueError, "half_life must be a finite number of seconds > 0, got inf"),
        ("1h", TypeError, "half_life must be a real number, got '1h'"),
        (None, TypeError, "half_life must be a real number, got None"),
    ],
)
def test_bad_half_life_is_named(half_life: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Scheduler(2, U, half_life=half_life)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
@pytest.mark.parametrize(
    ("owner", "priority", "match"),
    [
        (["a"], 0, r"owner must be hashable, got \['a'\] \(list\)"),
        ({"a": 1}, 0, r"owner must be hashable, got \{'a': 1\} \(dict\)"),
        ("a", 1.5, r"priority must be an int, got 1.5 \(float\)"),
        ("a", True, r"priority must be an int, got True \(bool\)"),
        (None, "high", r"priority must be an int, got 'high' \(str\)"),
    ],
)
def test_bad_owner_or_priority_changes_nothing(
    policy: str, owner: object, priority: object, match: str
) -> None:
    core = Scheduler(1, U, policy=policy)
    held = _busy(core, "a")
    bad = Demand(1, U, owner=owner, priority=priority)  # type: ignore[arg-type]
    for call in (core.submit, core.grant_now):
        with pytest.raises(TypeError, match=match):
            call(bad, now=1.0)  # type: ignore[operator]
    assert core.queue_length == 0 and core.free == (0,) and core.now == 0.0
    assert core.release(0, U, ticket=held.ticket) == []


# ------------------------------------------------- random inputs with owners (invariants)
class OwnersMachine(RuleBasedStateMachine):
    """Several owners, priorities and a clock: never over capacity, every ticket in one
    state, a head yields at most once, and once inputs stop, every waiter is granted."""

    def __init__(self) -> None:
        super().__init__()
        self.core = Scheduler([U, U, U // 2], shares={"b": 2.0}, half_life=20.0)
        self.held: dict[int, Grant] = {}
        self.waiting: set[int] = set()
        self.now = 0.0
        self.heads: list[int] = []
        self.owner_of: dict[int, str] = {}
        self.priority_of: dict[int, int] = {}
        # The reference model of usage (rule 8): each grant's owner, GPUs, start and end.
        self.spans: list[tuple[str, float, float, float | None]] = []
        self.span_of: dict[int, int] = {}

    def _absorb(self, grants: list[Grant]) -> None:
        totals = self.core.totals
        for grant in grants:
            assert grant.ticket in self.waiting
            self.waiting.discard(grant.ticket)
            self.held[grant.ticket] = grant
            gpus = sum(units / totals[gpu] for gpu, units in self.core.held(grant))
            self.span_of[grant.ticket] = len(self.spans)
            self.spans.append((self.owner_of[grant.ticket], gpus, self.now, None))

    def _ended(self, ticket: int) -> None:
        index = self.span_of.pop(ticket)
        owner, gpus, start, _ = self.spans[index]
        self.spans[index] = (owner, gpus, start, self.now)

    def _reference_usage(self, owner: str) -> float:
        """Rule 8 from first principles: the integral of the GPUs ``owner`` held, weighted
        2 ** -(age / half_life)."""
        k = math.log(2.0) / self.core.half_life
        total = 0.0
        for who, gpus, start, end in self.spans:
            if who == owner and gpus:
                stop = self.now if end is None else end
                total += (
                    gpus
                    * (math.exp(-k * (self.now - stop)) - math.exp(-k * (self.now - start)))
                    / k
                )
        return total

    @rule(
        owner=st.sampled_from(["a", "b", "c"]),
        priority=st.integers(-1, 1),
        count=st.integers(1, 3),
        units=st.sampled_from([100, 250, 500, 1000]),
        dt=st.sampled_from([0.0, 1.0, 5.0]),
        relative=st.booleans(),
    )
    def submit(  # noqa: PLR0917 (hypothesis passes each drawn value by name)
        self, owner: str, priority: int, count: int, units: int, dt: float, relative: bool
    ) -> None:
        self.now += dt
        if count > 1:
            demand = Demand(count, U, whole=True, owner=owner, priority=priority)
        else:
            demand = Demand(1, units, relative=relative, owner=owner, priority=priority)
        ticket, grant = self.core.submit(demand, now=self.now)
        self.owner_of[ticket] = owner
        self.priority_of[ticket] = priority
        self.waiting.add(ticket)
        self._absorb([grant] if grant else [])

    @precondition(lambda self: self.held)
    @rule(data=st.data(), dt=st.sampled_from([0.0, 2.0, 10.0]))
    def release(self, data: st.DataObject, dt: float) -> None:
        self.now += dt
        ticket = data.draw(st.sampled_from(sorted(self.held)))
        grant = self.held.pop(ticket)
        self._ended(ticket)
        self._absorb(self.core.release_many(self.core.held(grant), ticket=ticket, now=self.now))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        self.waiting.discard(ticket)
        self._absorb(self.core.cancel(ticket, now=self.now))

    @invariant()
    def capacity_adds_up(self) -> None:
        used = [0] * 3
        for grant in self.held.values():
            for gpu, units in self.core.held(grant):
                used[gpu] += units
        assert [f + u for f, u in zip(self.core.free, used, strict=True)] == list(self.core.totals)

    @invariant()
    def usage_follows_grants(self) -> None:
        totals = self.core.totals
        for owner in ("a", "b", "c"):
            held = sum(
                units / totals[gpu]
                for ticket, grant in self.held.items()
                if self.owner_of[ticket] == owner
                for gpu, units in self.core.held(grant)
            )
            assert self.core.running(owner) == pytest.approx(held, abs=1e-9)
            assert self.core.usage(owner) >= 0.0

    @invariant()
    def usage_is_the_decayed_integral(self) -> None:
        for owner in ("a", "b", "c"):
            expected = self._reference_usage(owner)
            assert self.core.usage(owner, self.now) == pytest.approx(expected, rel=1e-6, abs=1e-6)

    @invariant()
    def waiters_are_in_fair_order(self) -> None:
        """Rule 9 and 10 against a reference: owners by usage per share (ties: the owner whose
        earliest waiter came first), then each owner's waiters by priority, then FIFO."""
        by_owner: dict[str, list[int]] = {}
        for ticket in self.waiting:
            by_owner.setdefault(self.owner_of[ticket], []).append(ticket)
        ranked = sorted(
            by_owner,
            key=lambda o: (self.core.usage(o, self.now) / self.core.share(o), min(by_owner[o])),
        )
        expected = [
            t for o in ranked for t in sorted(by_owner[o], key=lambda t: (-self.priority_of[t], t))
        ]
        assert [w.ticket for w in self.core.waiters()] == expected

    @invariant()
    def queue_matches(self) -> None:
        assert {w.ticket for w in self.core.waiters()} == self.waiting
        head = self.core.head
        assert (head is None) == (not self.waiting)
        if head is not None and (not self.heads or self.heads[-1] != head.ticket):
            self.heads.append(head.ticket)
            # A waiter is head at most twice: before it yields and after (rule 10e).
            assert self.heads.count(head.ticket) <= 2

    def teardown(self) -> None:
        for _ in range(200):  # no starvation: with no new inputs every waiter is granted
            if not self.held:
                break
            self.now += 1.0
            ticket = min(self.held)
            grant = self.held.pop(ticket)
            self._absorb(self.core.release_many(self.core.held(grant), ticket=ticket, now=self.now))
        assert not self.waiting


OwnersMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40)
TestOwnersMachine = OwnersMachine.TestCase


# ----------------------------------------------------------------- usage bookkeeping
@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_usage_follows_partial_and_ticketless_releases(policy: str) -> None:
    core = Scheduler(2, U, policy=policy, half_life=1e9)  # next to no decay
    _, both = core.submit(Demand(2, U, owner="a"), now=0.0)
    assert both is not None
    core.release(0, U, ticket=both.ticket, now=10.0)  # one GPU back: a holds one more
    core.release(1, U, now=20.0)  # no ticket: the only grant there is a's
    assert core.usage("a", 20.0) == pytest.approx(30.0, rel=1e-6)  # 2 x 10 s + 1 x 10 s
    assert core.usage("a", 30.0) == pytest.approx(30.0, rel=1e-6)  # nothing held since
    _, small = core.submit(Demand(1, U // 4, owner="b"), now=30.0)
    _, other = core.submit(Demand(1, U // 2, owner="c"), now=30.0)
    assert small is not None and other is not None and small.gpus == other.gpus
    core.release(small.gpus[0], U // 2, now=40.0)  # no ticket: c's, which holds exactly that
    assert core.usage("c", 50.0) == pytest.approx(5.0, rel=1e-6)
    assert core.usage("b", 50.0) == pytest.approx(5.0, rel=1e-6)  # still running
    assert (core.running("a"), core.running("b"), core.running("c")) == (0.0, 0.25, 0.0)
    assert core.share("a") == 1.0 and core.half_life == 1e9


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_a_restored_grant_counts_for_the_default_owner(policy: str) -> None:
    core = Scheduler(2, U, policy=policy, half_life=1e9)
    grant = core.restore((0,), U, now=0.0)
    assert core.running(None) == 1.0
    core.release(0, U, ticket=grant.ticket, now=10.0)
    assert core.usage(None) == pytest.approx(10.0, rel=1e-6)
    assert core.running(None) == 0.0


@pytest.mark.parametrize("half_life", [1e-3, 1.0, 1e9, 1e18, 1e300])
def test_usage_is_exact_for_any_half_life(half_life: float) -> None:
    core = Scheduler(1, U, half_life=half_life)
    _, grant = core.submit(Demand(1, U, owner="a"), now=0.0)
    assert grant is not None
    core.release(0, U, ticket=grant.ticket, now=10.0)
    k = math.log(2.0) / half_life
    expected = -math.expm1(-k * 10.0) / k  # one GPU for 10 s, decayed to t=10
    assert core.usage("a") == pytest.approx(expected, rel=1e-9)


def test_usage_can_forget_its_grants_and_keep_what_was_used() -> None:
    usage = Usage([U, U], {"a": 2.0}, 1e9)
    usage.start(1, "a", {0: U, 1: U // 2}, 0.0)
    usage.finish(None, 1, U // 2, 4.0)  # no ticket: the only grant there
    assert usage.running("a") == 1.0
    usage.forget_grants(10.0)
    assert usage.running("a") == 0.0
    assert usage.usage("a", 20.0) == pytest.approx(12.0, rel=1e-6)  # 1.5 x 4 + 1 x 6
    assert usage.ratio("a", 20.0) == pytest.approx(6.0, rel=1e-6)
    usage.finish(1, 0, U, 20.0)  # forgotten: nothing is taken twice
    assert usage.running("a") == 0.0
