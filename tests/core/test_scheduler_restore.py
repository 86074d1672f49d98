"""Scheduler.restore: re-creating a held grant on given GPUs after a server restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hwpool._core._limits import LimitExceeded, OwnerLimits
from hwpool._core._scheduler import Demand, Scheduler

U = 1_000


def test_restore_takes_exactly_the_given_gpus_and_releases_like_any_grant() -> None:
    core = Scheduler(3, units_per_gpu=U, policy="reserve-all")
    first = core.restore((2,), 400)
    second = core.restore((0, 1), U)
    assert first.gpus == (2,) and first.units == 400
    assert second.gpus == (0, 1) and second.ticket != first.ticket
    assert core.free == (0, 0, 600)
    assert core.release_many([(0, U), (1, U)]) == []
    core.release(2, 400)
    assert core.free == (U, U, U)


def test_restored_capacity_is_not_granted_again() -> None:
    core = Scheduler(1, units_per_gpu=U, policy="reserve-all")
    core.restore((0,), 700)
    assert core.grant_now(Demand(1, 400)) is None
    _, grant = core.submit(Demand(1, 300))
    assert grant is not None and grant.gpus == (0,)


@pytest.mark.parametrize(
    ("gpus", "units", "match"),
    [
        ((0,), 600, "only 500 free"),
        ((1, 0), 600, "GPU 0: only 500 free"),
        ((), 10, "non-empty"),
        ((1, 1), 10, "distinct"),
        ((2,), 10, "gpu_id must be"),
        ((-1,), 10, "gpu_id must be"),
        ((1,), 0, ">= 1"),
        ((1,), U + 1, "only 1000 free"),
    ],
)
def test_restore_that_does_not_fit_raises_and_changes_nothing(
    gpus: tuple[int, ...], units: int, match: str
) -> None:
    core = Scheduler(2, units_per_gpu=U, policy="reserve-all")
    core.restore((0,), 500)
    with pytest.raises(ValueError, match=match):
        core.restore(gpus, units)
    assert core.free == (500, U)


def test_restore_refuses_while_requests_wait() -> None:
    core = Scheduler(1, units_per_gpu=U, policy="reserve-all")
    core.restore((0,), U)
    ticket, grant = core.submit(Demand(1, 100))
    assert grant is None
    with pytest.raises(ValueError, match="1 requests wait"):
        core.restore((0,), 1)
    assert core.is_waiting(ticket) and core.free == (0,)


# ----------------------------------------------------------------- issue 35: usage and limits
@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_a_restored_grant_counts_in_its_owners_usage_from_its_real_start(policy: str) -> None:
    """Held since t=40, taken back at t=100: its owner has used it 60 s, not 0 (a restart
    forgives) nor since the clock's origin (a restart inflates)."""
    core = Scheduler(2, U, policy=policy, half_life=1e9)
    grant = core.restore((0, 1), U, owner="a", now=100.0, since=40.0)
    assert core.usage("a", 100.0) == pytest.approx(120.0, rel=1e-6)  # 2 GPUs x 60 s
    core.release_many(core.held(grant), ticket=grant.ticket, now=110.0)
    assert core.usage("a", 130.0) == pytest.approx(140.0, rel=1e-6)  # and 10 s more
    assert core.running("a") == 0.0


@pytest.mark.parametrize("since", [None, 100.0, 250.0])
def test_a_restored_grant_with_no_earlier_start_counts_from_now(since: float | None) -> None:
    core = Scheduler(1, U, half_life=1e9)
    core.restore((0,), U, owner="a", now=100.0, since=since)
    assert core.usage("a", 110.0) == pytest.approx(10.0, rel=1e-6)


@pytest.mark.parametrize("mode", ["wait", "refuse"])
@pytest.mark.parametrize(
    ("limits", "held", "named"),
    [
        (OwnerLimits(gpus=1), {1: U}, "gpus"),
        (OwnerLimits(running=1), {1: U // 4}, "running"),
        (OwnerLimits(units=U + U // 2), {1: U}, "units"),
    ],
)
def test_taking_back_a_grant_past_its_owners_limit_is_refused_whatever_the_mode(
    limits: OwnerLimits, held: dict[int, int], named: str, mode: str
) -> None:
    """A grant held already cannot wait: past a limit it is refused, changing nothing."""
    core = Scheduler(2, U, limits={"a": replace(limits, mode=mode)})
    core.check_restore("a", {0: U})  # the first fits
    core.restore((0,), U, owner="a", now=1.0)
    with pytest.raises(LimitExceeded) as info:
        core.check_restore("a", held)
    assert info.value.limit == named and info.value.owner == "a"
    assert core.free == (0, U) and core.running("a") == 1.0
    core.check_restore("b", {1: U})  # another owner is not limited
