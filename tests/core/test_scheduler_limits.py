"""Limits per owner in the core (issue 23; rule 11 of the scheduler).

Unit tests for each limit and mode under both policies and on GPUs of different sizes, bad
inputs, and a hypothesis state machine against a reference model: never over capacity,
never an owner over its ``gpus`` or ``running`` limit through a grant, a refused request
changes nothing, and once inputs stop every waiter is granted (a held one included).
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hwpool._core._limits import LimitExceeded, LimitHold, OwnerLimits
from hwpool._core._scheduler import POLICIES, Demand, Grant, Scheduler

U = 1_000


def _one(owner: str, units: int = U) -> Demand:
    return Demand(1, units, owner=owner)


def _state(core: Scheduler, owners: tuple[Any, ...] = ("a", "b", "c")) -> tuple[Any, ...]:
    """Everything a refused request must leave as it was."""
    return (
        core.free,
        [(w.ticket, w.reserved, w.held) for w in core.waiters()],
        core.reservations(),
        core.head,
        [(core.running(o), core.usage(o)) for o in owners],
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_beyond_the_gpu_limit_waits_held_until_its_owner_releases(policy: str) -> None:
    core = Scheduler(4, U, policy=policy, limits={"a": OwnerLimits(gpus=2)})
    first = core.submit(_one("a"), now=0.0)[1]
    second = core.submit(_one("a"), now=0.0)[1]
    assert first is not None and second is not None
    ticket, grant = core.submit(_one("a"), now=0.0)
    assert grant is None
    held = core.held_by_limit(ticket)
    assert held == LimitHold("a", "gpus", 2, 2.0, 1.0)
    assert str(held) == "held: owner 'a' at its limit of 2 GPUs held at once (has 2, needs 1 more)"
    assert core.free == (0, 0, U, U)  # two GPUs stay free, and nobody reserves them
    assert core.reservations() == {}
    # Another owner is served at once, and a held waiter blocks nobody.
    assert core.submit(_one("b"), now=1.0)[1] is not None
    granted = core.release(first.gpus[0], U, ticket=first.ticket, now=2.0)
    assert [g.ticket for g in granted] == [ticket]
    assert core.running("a") == 2.0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_fraction_counts_its_share_of_its_gpu(policy: str) -> None:
    core = Scheduler(2, U, policy=policy, limits={"a": OwnerLimits(gpus=1)})
    for _ in range(4):
        assert core.submit(_one("a", 250), now=0.0)[1] is not None
    ticket, grant = core.submit(_one("a", 250), now=0.0)
    assert grant is None and core.held_by_limit(ticket) is not None
    assert core.running("a") == 1.0 and core.free == (0, U)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_running_limit_counts_grants(policy: str) -> None:
    core = Scheduler(4, U, policy=policy, default_limits=OwnerLimits(running=2))
    grants = [core.submit(_one("x", 100), now=0.0)[1] for _ in range(2)]
    ticket, grant = core.submit(_one("x", 100), now=0.0)
    assert grant is None
    assert core.held_by_limit(ticket) == LimitHold("x", "running", 2, 2, 1)
    first = grants[0]
    assert first is not None
    assert [g.ticket for g in core.release(first.gpus[0], 100, ticket=first.ticket)] == [ticket]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_held_waiter_is_never_head_and_blocks_nobody(policy: str) -> None:
    core = Scheduler(2, U, policy=policy, limits={"a": OwnerLimits(gpus=1)})
    mine = core.submit(_one("a"), now=0.0)[1]
    other = core.submit(_one("b"), now=0.0)[1]
    assert mine is not None and other is not None
    held, _ = core.submit(_one("a"), now=1.0)
    behind, _ = core.submit(_one("b"), now=2.0)  # waits for capacity, behind the held one
    if policy == "easy":
        assert core.head is not None and core.head.ticket == behind
    else:
        assert core.reservations() == {behind: (0,)}
    assert [w.held is not None for w in core.waiters()] == [True, False]
    # The other owner's GPU comes back: the first waiter a limit does not hold is served.
    assert [g.ticket for g in core.release(1, U, ticket=other.ticket, now=3.0)] == [behind]
    assert core.head is None and core.held_by_limit(held) is not None


@pytest.mark.parametrize("policy", POLICIES)
def test_a_held_waiter_is_not_granted_when_capacity_frees(policy: str) -> None:
    # A GPU frees while a's waiter is held and another owner's head does not fit: the walk
    # (backfill under easy, the queue walk under reserve-all) must pass the held waiter by.
    core = Scheduler(4, U, policy=policy, limits={"a": OwnerLimits(gpus=1)})
    for owner in ("b", "b", "a", "c"):
        assert core.submit(_one(owner), now=0.0)[1] is not None
    held, _ = core.submit(_one("a"), now=0.0)
    wide, _ = core.submit(Demand(2, U, owner="d"), now=0.0)
    assert core.release(3, U, now=1.0) == []
    assert core.is_waiting(wide)
    assert core.is_waiting(held) and core.held_by_limit(held) is not None
    assert core.running("a") == 1.0 and core.free == (0, 0, 0, U)
    if policy == "easy":  # the free GPU is anyone else's (under reserve-all, d reserves it)
        assert core.submit(_one("e"), now=1.0)[1] is not None


def test_the_head_is_the_first_waiter_no_limit_holds_in_its_owners_priority_order() -> None:
    core = Scheduler(2, U, limits={"a": OwnerLimits(gpus=2)})
    assert core.submit(_one("a"), now=0.0)[1] is not None
    assert core.submit(_one("b"), now=0.0)[1] is not None
    half, _ = core.submit(_one("a", 500), now=0.0)  # the head: a has 1 and asks 0.5
    whole = core.submit(Demand(1, U, owner="a", priority=1), now=0.0)[0]
    quarter = core.submit(Demand(1, 250, owner="a", priority=1), now=0.0)[0]
    assert core.head is not None and core.head.ticket == half
    assert core.held_by_limit(whole) == LimitHold("a", "gpus", 2, 1.5, 1.0)  # with the head's
    assert core.held_by_limit(quarter) is None
    core.cancel(half, now=1.0)  # the whole GPU fits a's limit now, and comes first in a's order
    assert core.head is not None and core.head.ticket == whole
    assert core.held_by_limit(quarter) is not None


@pytest.mark.parametrize("policy", POLICIES)
def test_a_waiter_that_reserves_keeps_room_in_its_owners_limit(policy: str) -> None:
    # Owner a may hold 2 GPUs; its 2-GPU request waits for capacity: its 1-GPU requests
    # behind it must not take the room it will need within the limit.
    core = Scheduler(3, U, policy=policy, limits={"a": OwnerLimits(gpus=2)})
    blocker = core.submit(Demand(2, U, owner="b"), now=0.0)[1]
    assert blocker is not None
    wide, _ = core.submit(Demand(2, U, owner="a"), now=0.0)
    small, grant = core.submit(_one("a"), now=1.0)
    assert grant is None and core.held_by_limit(small) is not None
    assert core.free == (0, 0, U)
    granted = core.release_many(core.held(blocker), ticket=blocker.ticket, now=2.0)
    assert [g.ticket for g in granted] == [wide]


@pytest.mark.parametrize("policy", POLICIES)
def test_limits_on_gpus_of_different_sizes(policy: str) -> None:
    # 600 units is 0.6 of GPU 0 and 1.0 of GPU 1: it counts 1.0 wherever it lands.
    core = Scheduler([U, 600], policy=policy, limits={"a": OwnerLimits(gpus=1.5)})
    first = core.submit(_one("a", 600), now=0.0)[1]
    assert first is not None and first.gpus == (1,)
    ticket, grant = core.submit(_one("a", 600), now=0.0)
    assert grant is None
    assert core.held_by_limit(ticket) == LimitHold("a", "gpus", 1.5, 1.0, 1.0)
    # A relative half GPU counts a half anywhere.
    assert core.submit(Demand(1, 500, relative=True, owner="a"), now=0.0)[1] is not None
    with pytest.raises(LimitExceeded, match=r"a request for 2 GPUs could never run"):
        core.submit(Demand(2, U, whole=True, owner="a"))


@pytest.mark.parametrize("policy", POLICIES)
def test_the_units_limit_counts_units_held_on_every_gpu(policy: str) -> None:
    # GPUs of 80 and 24 "MiB": owner a may hold 30 in all, wherever they are.
    core = Scheduler([80, 24], policy=policy, limits={"a": OwnerLimits(units=30)})
    assert core.submit(_one("a", 20), now=0.0)[1] is not None
    ticket, grant = core.submit(_one("a", 20), now=0.0)
    assert grant is None
    assert core.held_by_limit(ticket) == LimitHold("a", "units", 30, 20, 20)
    assert str(core.held_by_limit(ticket)).endswith("limit of 30 units held at once (has 20, "
                                                    "needs 20 more)")  # fmt: skip
    assert core.submit(_one("a", 10), now=0.0)[1] is not None  # 30 in all: at the limit
    with pytest.raises(
        LimitExceeded,
        match=r"limited to 30 units held at once \(units=30\); a request for 31 could never",
    ):
        core.submit(_one("a", 31))
    with pytest.raises(LimitExceeded, match=r"a request for 104 could never run"):
        core.submit(Demand(2, 80, whole=True, owner="a"))  # the two largest GPUs, 80 + 24


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_that_could_never_run_is_refused(policy: str) -> None:
    core = Scheduler(4, U, policy=policy, limits={"a": OwnerLimits(gpus=1.5)})
    before = _state(core)
    for call in (core.submit, core.grant_now):
        with pytest.raises(LimitExceeded) as caught:
            call(Demand(2, U, owner="a"), now=5.0)  # type: ignore[operator]
        assert (caught.value.owner, caught.value.limit) == ("a", "gpus")
        assert (caught.value.allowed, caught.value.value) == (1.5, 2.0)
        assert str(caught.value) == (
            "owner 'a' is limited to 1.5 GPUs held at once (gpus=1.5); a request for 2 GPUs "
            "could never run"
        )
    assert _state(core) == before and core.queue_length == 0
    assert core.submit(Demand(2, U, owner="b"), now=5.0)[1] is not None  # others are not limited


@pytest.mark.parametrize("policy", POLICIES)
def test_the_queued_limit_refuses_only_a_request_that_would_wait(policy: str) -> None:
    core = Scheduler(3, U, policy=policy, limits={"a": OwnerLimits(queued=1)})
    for units in (U, 600, 600):
        assert core.submit(_one("b", units), now=0.0)[1] is not None
    assert core.submit(_one("a"), now=0.0)[1] is None  # waits: the one allowed
    before = _state(core)
    with pytest.raises(LimitExceeded, match=r"limited to 1 waiting request \(queued=1\); it has 1"):
        core.submit(_one("a"), now=1.0)
    assert _state(core) == before
    # One that fits at once is granted, whatever is queued.
    assert core.submit(_one("a", 400), now=1.0)[1] is not None


@pytest.mark.parametrize("policy", POLICIES)
def test_refuse_mode_refuses_what_would_be_held(policy: str) -> None:
    limits = {"a": OwnerLimits(gpus=2, running=3, mode="refuse")}
    core = Scheduler(4, U, policy=policy, limits=limits)
    core.submit(Demand(3, U, owner="b"), now=0.0)
    assert core.submit(_one("a"), now=0.0)[1] is not None
    waiting, grant = core.submit(_one("a"), now=0.0)  # waits for capacity: 2 GPUs in all
    assert grant is None and core.held_by_limit(waiting) is None
    before = _state(core)
    with pytest.raises(LimitExceeded) as caught:
        core.submit(_one("a", 100), now=1.0)
    assert caught.value.limit == "gpus" and caught.value.value == pytest.approx(2.1)
    assert "it holds 1 and asks 1 waiting" in str(caught.value)
    with pytest.raises(LimitExceeded, match=r"it holds 1 and asks 1 waiting"):
        core.grant_now(_one("a", 100), now=1.0)
    assert _state(core) == before


def test_no_limits_named_means_none() -> None:
    core = Scheduler(2, U, limits={"a": OwnerLimits()}, default_limits=OwnerLimits())
    assert core.limits("a") is None and core.limits("b") is None
    for _ in range(3):
        core.submit(_one("a"), now=0.0)
    assert all(w.held is None for w in core.waiters())


def test_default_limits_apply_to_owners_not_named_and_to_the_default_owner() -> None:
    core = Scheduler(
        4, U, limits={"root": OwnerLimits()}, default_limits=OwnerLimits(gpus=1, mode="refuse")
    )
    assert core.limits("root") is None
    assert core.limits(None) == OwnerLimits(gpus=1, mode="refuse")
    assert core.submit(Demand(1, U), now=0.0)[1] is not None
    with pytest.raises(LimitExceeded, match=r"owner None is limited to 1 GPU held at once"):
        core.submit(Demand(1, U), now=0.0)
    assert core.submit(Demand(2, U, owner="root"), now=0.0)[1] is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"gpus": -1}, ValueError, r"gpus must be a finite number > 0, got -1"),
        ({"gpus": 0}, ValueError, r"gpus must be a finite number > 0, got 0"),
        ({"gpus": float("inf")}, ValueError, r"gpus must be a finite number > 0, got inf"),
        ({"gpus": "2"}, TypeError, r"gpus must be a real number, got '2'"),
        ({"running": 0}, ValueError, r"running must be >= 1, got 0"),
        ({"running": 1.5}, TypeError, r"running must be an int, got 1.5 \(float\)"),
        ({"queued": -1}, ValueError, r"queued must be >= 0, got -1"),
        ({"queued": True}, TypeError, r"queued must be an int, got True \(bool\)"),
        ({"units": 0}, ValueError, r"units must be >= 1, got 0"),
        ({"units": 2.5}, TypeError, r"units must be an int, got 2.5 \(float\)"),
        ({"mode": "drop"}, ValueError, r"mode must be one of wait, refuse; got 'drop'"),
        ({"mode": 1}, TypeError, r"mode must be a str, got 1 \(int\)"),
    ],
)
def test_bad_limits_name_the_field_and_value(
    kwargs: dict[str, object], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        OwnerLimits(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"limits": [("a", OwnerLimits(gpus=1))]}, r"limits must be a mapping of owner to"),
        ({"limits": {"a": 2}}, r"limits\['a'\] must be an OwnerLimits, got 2 \(int\)"),
        ({"default_limits": {"gpus": 1}}, r"default_limits must be an OwnerLimits or None"),
    ],
)
def test_bad_limit_arguments_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        Scheduler(2, U, **kwargs)


# ----------------------------------------------------------------- the state machine
LIMITS = {
    "a": OwnerLimits(gpus=1.5, running=2, queued=3),
    "b": OwnerLimits(gpus=1, mode="refuse"),
    "d": OwnerLimits(units=1500),
}
DEFAULT = OwnerLimits(running=3)  # owner c's
OWNERS = ("a", "b", "c", "d")


class LimitsMachine(RuleBasedStateMachine):
    """Three owners with different limits (a: wait, b: refuse, c: the default) on GPUs
    ``TOTALS`` under ``POLICY``, against a model of what each owner holds and waits for."""

    TOTALS: ClassVar[list[int]] = [U, U, U, U]
    POLICY = "easy"

    def __init__(self) -> None:
        super().__init__()
        self.core = Scheduler(
            self.TOTALS, policy=self.POLICY, limits=LIMITS, default_limits=DEFAULT
        )
        self.held: dict[int, Grant] = {}
        self.waiting: dict[int, str] = {}
        self.owner_of: dict[int, str] = {}
        self.now = 0.0

    def _absorb(self, grants: list[Grant]) -> None:
        for grant in grants:
            assert grant.ticket in self.waiting
            del self.waiting[grant.ticket]
            self.held[grant.ticket] = grant

    def _demand(self, owner: str, count: int, units: int, relative: bool) -> Demand:
        if count > 1:
            return Demand(count, max(self.TOTALS), whole=True, owner=owner)
        return Demand(1, units, relative=relative, owner=owner)

    @rule(
        owner=st.sampled_from(OWNERS),
        count=st.integers(1, 3),
        units=st.sampled_from([250, 500, 1000]),
        relative=st.booleans(),
        dt=st.sampled_from([0.0, 1.0]),
        now_only=st.booleans(),
    )
    def submit(  # noqa: PLR0917 (hypothesis passes each drawn value by name)
        self, owner: str, count: int, units: int, relative: bool, dt: float, now_only: bool
    ) -> None:
        self.now += dt
        demand = self._demand(owner, count, units, relative)
        before = _state(self.core, OWNERS)
        try:
            if now_only:
                grant = self.core.grant_now(demand, now=self.now)
                ticket = None if grant is None else grant.ticket
            else:
                ticket, grant = self.core.submit(demand, now=self.now)
        except LimitExceeded as refused:
            assert refused.owner == owner
            assert _state(self.core, OWNERS) == before  # a refused request changes nothing
            return
        if ticket is None:
            return
        self.owner_of[ticket] = owner
        self.waiting[ticket] = owner
        self._absorb([grant] if grant else [])

    @precondition(lambda self: self.held)
    @rule(data=st.data(), dt=st.sampled_from([0.0, 2.0]))
    def release(self, data: st.DataObject, dt: float) -> None:
        self.now += dt
        ticket = data.draw(st.sampled_from(sorted(self.held)))
        grant = self.held.pop(ticket)
        self._absorb(self.core.release_many(self.core.held(grant), ticket=ticket, now=self.now))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.waiting)))
        del self.waiting[ticket]
        self._absorb(self.core.cancel(ticket, now=self.now))

    @invariant()
    def never_over_capacity(self) -> None:
        used = [0] * len(self.TOTALS)
        for grant in self.held.values():
            for gpu, units in self.core.held(grant):
                used[gpu] += units
        assert [f + u for f, u in zip(self.core.free, used, strict=True)] == self.TOTALS

    @invariant()
    def never_over_a_limit(self) -> None:
        for owner in OWNERS:
            limits = LIMITS.get(owner, DEFAULT)
            mine = [g for t, g in self.held.items() if self.owner_of[t] == owner]
            gpus = sum(u / self.TOTALS[gpu] for g in mine for gpu, u in self.core.held(g))
            assert self.core.running(owner) == pytest.approx(gpus, abs=1e-9)
            if limits.gpus is not None:
                assert gpus <= limits.gpus + 1e-9
            if limits.running is not None:
                assert len(mine) <= limits.running
            if limits.queued is not None:
                assert sum(1 for o in self.waiting.values() if o == owner) <= limits.queued
            if limits.units is not None:
                assert sum(u for g in mine for _, u in self.core.held(g)) <= limits.units

    @invariant()
    def queue_matches(self) -> None:
        waiters = list(self.core.waiters())
        assert {w.ticket for w in waiters} == set(self.waiting)
        head = self.core.head
        for waiter in waiters:
            if waiter.held is not None:
                owner = self.waiting[waiter.ticket]
                assert waiter.held.owner == owner
                self._check_hold_is_real(owner, waiter.held)
                assert owner != "b" or len(set(self.TOTALS)) > 1  # refuse: never held
                assert head is None or head.ticket != waiter.ticket
                assert not waiter.reserved
        if self.POLICY == "easy" and head is None:  # no head: every waiter is held
            assert all(w.held is not None for w in waiters)

    def _check_hold_is_real(self, owner: str, held: LimitHold) -> None:
        """A hold names a limit the owner would pass: what it holds (in the model), with
        what its reserving waiters keep, plus what the waiter needs."""
        limits = LIMITS.get(owner, DEFAULT)
        mine = [g for t, g in self.held.items() if self.owner_of[t] == owner]
        if held.limit == "running":
            assert held.allowed == limits.running and held.used >= len(mine)
            assert held.used + 1 > held.allowed
        elif held.limit == "units":
            units = sum(u for g in mine for _, u in self.core.held(g))
            assert held.allowed == limits.units and held.used >= units
            assert held.used + held.need > held.allowed
        else:
            gpus = sum(u / self.TOTALS[gpu] for g in mine for gpu, u in self.core.held(g))
            assert held.limit == "gpus" and held.allowed == limits.gpus
            assert held.used >= gpus - 1e-9 and held.used + held.need > held.allowed

    def teardown(self) -> None:
        for _ in range(200):  # no starvation: once inputs stop, every waiter is granted
            if not self.held:
                break
            self.now += 1.0
            ticket = min(self.held)
            grant = self.held.pop(ticket)
            self._absorb(self.core.release_many(self.core.held(grant), ticket=ticket, now=self.now))
        assert not self.waiting


def _machine(totals: list[int], policy: str) -> Any:
    machine = type(
        f"LimitsMachine_{policy}_{len(set(totals))}",
        (LimitsMachine,),
        {"TOTALS": totals, "POLICY": policy},
    )
    machine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
    return machine.TestCase


TestLimitsEasy = _machine([U, U, U, U], "easy")
TestLimitsReserveAll = _machine([U, U, U, U], "reserve-all")
TestLimitsEasySizes = _machine([U, U, U, U // 2], "easy")
TestLimitsReserveAllSizes = _machine([U, U, U, U // 2], "reserve-all")
