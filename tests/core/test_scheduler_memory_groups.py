"""Rule 13: GPUs that draw on one memory (MIG compute instances of one GPU instance).

NVIDIA's MIG User Guide ("MIG Device Names"): a GPU instance may be split into several
compute instances; each is a CUDA device of its own, and all of them share the GPU instance's
memory. The H200 MIG capture (``tests/fakes/captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt``)
shows two compute instances of GPU instance 2, each reporting the same 71424 MiB. The core
must never grant more on such devices together than that one memory holds.

Bad input, the cases by hand under both policies, and a random state machine that checks,
after every call, that the units held on a group's GPUs never exceed its capacity, that each
GPU's free units are the least of its own and its group's, and that the head is granted once
nothing else is.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hwpool._core._scheduler import POLICIES, Demand, Grant, Scheduler

U = 1_000
GROUPS = ["gi2", "gi2", None, "gi9", "gi9", "gi9"]  # two groups and a GPU of its own


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        (5, TypeError, r"memory_groups must be a sequence .* got 5 \(int\)"),
        ("ab", TypeError, r"memory_groups must be a sequence .* got 'ab' \(str\)"),
        (["a", "a"], ValueError, r"memory_groups must name one group per GPU \(3\), got 2"),
        (["a", ["x"], None], TypeError, r"memory_groups\[1\] must be hashable, got \['x'\]"),
    ],
)
def test_bad_memory_groups_are_refused_by_name(groups: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Scheduler(3, U, memory_groups=groups)  # type: ignore[arg-type]


def test_gpus_of_one_memory_must_have_one_total() -> None:
    with pytest.raises(ValueError, match=r"GPUs \[0, 1\] share one memory but have different"):
        Scheduler([U, 2 * U, U], memory_groups=["a", "a", None])


@pytest.mark.parametrize("policy", POLICIES)
def test_two_compute_instances_are_never_granted_more_than_their_memory(policy: str) -> None:
    """The defect of issue 36: 60% on each of two devices of one memory is 120% of it."""
    core = Scheduler([U, U, U], policy=policy, memory_groups=["gi2", "gi2", None])
    _, first = core.submit(Demand(1, 600))
    assert first is not None and first.gpus == (0,)
    assert core.free == (400, 400, U)  # the other compute instance sees what is left
    _, second = core.submit(Demand(1, 600))
    assert second is not None and second.gpus == (2,), "not on GPU 1: its memory is held"
    ticket, third = core.submit(Demand(1, 600))
    assert third is None  # waits: neither memory has 600 left
    assert core.memory_held() == (((0, 1), U, 600),)
    granted = core.release(0, 600, ticket=first.ticket)
    assert [g.ticket for g in granted] == [ticket]
    assert granted[0].gpus[0] in (0, 1)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_whole_compute_instance_holds_its_whole_memory(policy: str) -> None:
    """A process on a compute instance may allocate all of its GPU instance's memory, so a
    whole-device grant leaves nothing on the other devices of that memory."""
    core = Scheduler([U, U], policy=policy, memory_groups=["gi2", "gi2"])
    _, grant = core.submit(Demand(1, U, whole=True))
    assert grant is not None and core.free == (0, 0)
    _, small = core.submit(Demand(1, 1))
    assert small is None
    assert [g.gpus for g in core.release(0, U, ticket=grant.ticket)] == [(0,)]


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpus_of_one_grant_never_share_a_memory(policy: str) -> None:
    core = Scheduler([U] * 3, policy=policy, memory_groups=["gi2", "gi2", None])
    _, grant = core.submit(Demand(2, U))
    assert grant is not None and grant.gpus == (0, 2)
    with pytest.raises(ValueError, match=r"count must be at most 2 \(whole GPUs that share no"):
        core.submit(Demand(3, U))


def test_a_release_gives_back_only_what_that_gpu_holds() -> None:
    core = Scheduler([U, U], memory_groups=["gi2", "gi2"])
    core.submit(Demand(1, 300))
    with pytest.raises(ValueError, match="cannot release 1 units on GPU 1: only 0 held"):
        core.release(1, 1)
    assert core.free == (700, 700)


def test_no_memory_groups_and_groups_of_one_change_nothing() -> None:
    plain, single = Scheduler([U] * 3), Scheduler([U] * 3, memory_groups=["a", None, "b"])
    assert single.memory_groups == () and single.memory_held() == ()
    for demand in (Demand(1, 600), Demand(1, 600), Demand(2, U), Demand(1, 400)):
        assert plain.submit(demand) == single.submit(demand)
    assert plain.free == single.free


def test_the_easy_head_is_not_starved_through_another_device_of_its_memory() -> None:
    """Rule 13 with rule 4e: the head reserves GPU 0; GPU 1 shares its memory, so a stream
    of small requests without limits must not keep taking that memory on GPU 1."""
    core = Scheduler([U, U], memory_groups=["gi2", "gi2"])
    _, held = core.submit(Demand(1, 500), now=0.0)
    assert held is not None
    head, granted = core.submit(Demand(1, U, whole=True), now=1.0)
    assert granted is None
    _, small = core.submit(Demand(1, 100), now=2.0)
    assert small is None, "GPU 1 draws on the head's memory"
    granted_now = core.release(held.gpus[0], 500, ticket=held.ticket, now=3.0)
    assert granted_now[0].ticket == head


def test_a_reserve_all_reservation_closes_the_other_devices_of_its_memory() -> None:
    """Rule 13 with rule 4: the waiter reserves GPU 0; GPU 1 draws on the same memory, so a
    new arrival may not backfill there either."""
    core = Scheduler([U, U, U], policy="reserve-all", memory_groups=["gi2", "gi2", None])
    _, half = core.submit(Demand(1, 500))
    _, full = core.submit(Demand(1, U))
    assert half is not None and full is not None and (half.gpus, full.gpus) == ((0,), (2,))
    waiter, none = core.submit(Demand(1, 800))
    assert none is None and core.reservations() == {waiter: (0,)}
    _, small = core.submit(Demand(1, 100))
    assert small is None, "GPU 1 draws on the reserved memory"
    granted = core.release(0, 500, ticket=half.ticket)
    assert granted[0].ticket == waiter


# ----------------------------------------------------------------- the random machine
class MemoryGroupMachine(RuleBasedStateMachine):
    """Random submits, releases and cancels on :data:`GROUPS`; the rule-13 invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.core: Scheduler | None = None
        self.held: list[Grant] = []
        self.waiting: list[int] = []
        self.now = 0.0

    @rule(policy=st.sampled_from(POLICIES))
    @precondition(lambda self: self.core is None)
    def build(self, policy: str) -> None:
        self.core = Scheduler([U] * len(GROUPS), policy=policy, memory_groups=GROUPS)

    def take(self, grants: list[Grant]) -> None:
        for grant in grants:
            self.held.append(grant)
            self.waiting.remove(grant.ticket)

    @precondition(lambda self: self.core is not None)
    @rule(
        units=st.sampled_from([100, 250, 400, 600, 999, U]),
        count=st.sampled_from([1, 1, 1, 2]),
        whole=st.booleans(),
        limit=st.sampled_from([None, 1.0, 5.0]),
    )
    def submit(self, units: int, count: int, whole: bool, limit: float | None) -> None:
        assert self.core is not None
        self.now += 1.0
        demand = Demand(count, U if count > 1 else units, whole=whole, limit=limit)
        ticket, grant = self.core.submit(demand, now=self.now)
        self.waiting.append(ticket)
        if grant is not None:
            self.take([grant])

    @precondition(lambda self: self.core is not None and self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        assert self.core is not None
        self.now += 1.0
        grant = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.take(self.core.release_many(self.core.held(grant), ticket=grant.ticket, now=self.now))

    @precondition(lambda self: self.core is not None and self.waiting)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        assert self.core is not None
        self.now += 1.0
        ticket = data.draw(st.sampled_from(self.waiting))
        self.waiting.remove(ticket)
        self.take(self.core.cancel(ticket, now=self.now))

    def units_on(self) -> list[int]:
        on = [0] * len(GROUPS)
        assert self.core is not None
        for grant in self.held:
            for gpu, units in self.core.held(grant):
                on[gpu] += units
        return on

    @invariant()
    def a_group_never_holds_more_than_its_memory(self) -> None:
        if self.core is None:
            return
        on = self.units_on()
        for name in {g for g in GROUPS if g is not None}:
            members = [gpu for gpu, g in enumerate(GROUPS) if g == name]
            assert sum(on[gpu] for gpu in members) <= U, (name, on)
        for gpus, capacity, held in self.core.memory_held():
            assert held == sum(on[gpu] for gpu in gpus) <= capacity

    @invariant()
    def free_is_the_least_of_the_gpus_and_its_groups(self) -> None:
        if self.core is None:
            return
        on = self.units_on()
        for gpu, group in enumerate(GROUPS):
            members = [g for g, name in enumerate(GROUPS) if name == group and group is not None]
            room = U - sum(on[m] for m in members) if members else U - on[gpu]
            assert self.core.free[gpu] == min(U - on[gpu], room), (gpu, self.core.free, on)

    @invariant()
    def nobody_waits_on_an_idle_machine(self) -> None:
        if self.core is not None and not self.held:
            assert not self.waiting, "requests wait while nothing is held"


MemoryGroupMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None
)
TestMemoryGroupMachine = MemoryGroupMachine.TestCase
