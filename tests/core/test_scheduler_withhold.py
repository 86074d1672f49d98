"""Withholding capacity (``Scheduler.withhold``): units of a GPU taken out of what is shared,
as a lease held by no one would (the host server withholds memory used outside the queue)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from test_scheduler import SchedulerMachine, U

from hwpool._core._scheduler import Demand, Scheduler


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_withheld_units_are_not_granted_and_come_back(policy: str) -> None:
    core = Scheduler([100], policy=policy)
    assert core.withhold(0, 60, now=0.0) == []
    assert core.free == (40,) and core.withheld == (60,)
    assert core.grant_now(Demand(1, 50), now=1.0) is None
    ticket, grant = core.submit(Demand(1, 50), now=1.0)
    assert grant is None
    grants = core.withhold(0, 0, now=2.0)
    assert [(g.ticket, g.gpus, g.units) for g in grants] == [(ticket, (0,), 50)]
    assert core.free == (50,) and core.withheld == (0,)


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_withholding_over_a_lease_waits_for_its_release(policy: str) -> None:
    core = Scheduler([100], policy=policy)
    lease = core.grant_now(Demand(1, 80), now=0.0)
    assert lease is not None
    core.withhold(0, 50, now=1.0)
    assert core.free == (-30,)
    ticket, grant = core.submit(Demand(1, 60), now=1.0)
    assert grant is None
    assert core.release(0, 80, ticket=lease.ticket, now=2.0) == []  # 50 free: 60 does not fit
    assert core.free == (50,)
    grants = core.withhold(0, 30, now=3.0)
    assert [(g.ticket, g.units) for g in grants] == [(ticket, 60)]


def test_a_whole_gpu_with_something_withheld_is_not_whole() -> None:
    core = Scheduler(2, units_per_gpu=U)
    core.withhold(1, 1)
    assert core.grant_now(Demand(2, U)) is None
    grant = core.grant_now(Demand(1, U))
    assert grant is not None and grant.gpus == (0,)


def test_rebuild_keeps_what_is_withheld() -> None:
    core = Scheduler(2, units_per_gpu=U)
    core.withhold(0, 300)
    ticket, grant = core.submit(Demand(1, U))
    assert grant is not None and grant.gpus == (1,)
    core.rebuild([(ticket, [(1, U)])], [])
    assert core.free == (U - 300, 0) and core.withheld == (300, 0)


@pytest.mark.parametrize(
    ("gpu", "units", "error", "match"),
    [
        (2, 10, ValueError, "gpu_id"),
        (-1, 10, ValueError, "gpu_id"),
        (0, -1, ValueError, "units to withhold"),
        (0, U + 1, ValueError, "units to withhold"),
        (0, 1.5, TypeError, "units to withhold"),
        (0, True, TypeError, "units to withhold"),
        ("0", 10, TypeError, "gpu_id"),
    ],
)
def test_bad_withhold_raises_and_changes_nothing(
    gpu: object, units: object, error: type[Exception], match: str
) -> None:
    core = Scheduler(2, units_per_gpu=U)
    core.withhold(0, 100)
    with pytest.raises(error, match=match):
        core.withhold(gpu, units)  # type: ignore[arg-type]
    assert core.free == (U - 100, U) and core.withheld == (100, 0)


class WithholdingMachine(SchedulerMachine):
    """The scheduler's invariants under random use, with capacity withheld and given back
    at random too: capacity adds up with what is withheld, reservations follow the rule
    on the free units left, and no walk leaves a waiter that fits."""

    @rule(gpu=st.integers(0, 3), units=st.integers(0, U))
    def withhold(self, gpu: int, units: int) -> None:
        self._absorb(self.core.withhold(gpu, units))

    @invariant()
    def capacity_adds_up(self) -> None:
        for gpu in range(4):
            granted = sum(u for g, u in self.held if g == gpu)
            assert self.core.free[gpu] + granted + self.core.withheld[gpu] == U


WithholdingMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40)
TestWithholdingMachine = WithholdingMachine.TestCase
