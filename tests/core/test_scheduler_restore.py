"""Scheduler.restore: re-creating a held grant on given GPUs after a server restart."""

from __future__ import annotations

import pytest

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
