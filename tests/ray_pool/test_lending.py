"""Kept leases lent to the driver, which launches tasks on them itself (``ray/_lending.py``).

On the real local cluster (2 nodes x 2 fake GPUs). Each test first runs one task through the
client and waits until the client has lent its kept lease to the driver; ``keep_s`` is long,
so that no lease expires on a loaded machine while a test looks at it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from test_cluster import eventually, free_everywhere, lease_numbers  # noqa: E402
from test_cluster import pool as cluster_pool  # noqa: E402
from test_promises import Gate, pid_is_gone, wait_at  # noqa: E402

import hwpool  # noqa: E402
import hwpool.ray  # noqa: E402
from hwpool.ray import RayGPUPool  # noqa: E402
from hwpool.ray._lending import LentLeases  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

pool = cluster_pool  # the fixture: a namespace (so a scheduler) of its own

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def gpus_seen() -> tuple[int, ...]:
    return tuple(hwpool.current_gpus())


@pytest.fixture
def keeper(pool: RayGPUPool) -> Iterator[RayGPUPool]:
    """A second driver pool on ``pool``'s queue that keeps leases for a minute."""
    keeper = hwpool.ray.connect(namespace=pool.namespace, keep_s=60)
    try:
        yield keeper
    finally:
        keeper.close()


def lent(pool: RayGPUPool) -> LentLeases:
    assert pool._lent is not None
    return pool._lent


def lend_one(keeper: RayGPUPool, **demand: Any) -> None:
    """Run one task of ``demand`` through the client; wait until its lease is lent."""
    assert ray.get(keeper.submit(gpus_seen, **demand), timeout=60)
    eventually(lambda: lent(keeper).held() == (1, 0))


def test_tasks_of_a_lent_leases_demand_are_launched_by_the_driver(keeper: RayGPUPool) -> None:
    lend_one(keeper, fraction=0.25)
    (lease,) = keeper.snapshot().leases
    for launched in range(1, 6):
        assert ray.get(keeper.submit(gpus_seen, fraction=0.25), timeout=60) == lease.gpus
        assert lent(keeper).launched == launched
    assert [x.request for x in keeper.snapshot().leases] == [lease.request]  # none asked
    # Another demand has no lent lease: through the client, which asks for its own.
    assert ray.get(keeper.submit(gpus_seen, gpus=1), timeout=60)
    assert lent(keeper).launched == 5
    # Nor has a second task while the first runs on the only lent lease.
    gate = ray.remote(num_cpus=0)(Gate).remote()
    first = keeper.submit(wait_at, gate, "first", fraction=0.25)
    second = keeper.submit(gpus_seen, fraction=0.25)
    assert lent(keeper).launched == 6
    assert ray.get(second, timeout=60)
    assert lent(keeper).launched == 6
    ray.get(gate.open.remote())
    assert ray.get(first, timeout=60)


def test_a_function_launched_again_is_shipped_once_and_one_made_afresh_every_time(
    keeper: RayGPUPool,
) -> None:
    lend_one(keeper, fraction=0.25)
    launchers = lent(keeper)._launchers
    for _ in range(3):
        assert ray.get(keeper.submit(gpus_seen, fraction=0.25), timeout=60)
    assert [fn for fn, _ in launchers._bound.values()] == [gpus_seen]
    for _ in range(3):
        made_afresh = lambda: tuple(hwpool.current_gpus())  # noqa: E731
        assert ray.get(keeper.submit(made_afresh, fraction=0.25), timeout=60)
    assert [fn for fn, _ in launchers._bound.values()] == [gpus_seen]  # not bound
    assert lent(keeper).launched == 6


def test_no_task_passes_an_unfinished_call_through_the_client(keeper: RayGPUPool) -> None:
    lend_one(keeper, fraction=0.25)
    gate = ray.remote(num_cpus=0)(Gate).remote()
    earlier = keeper.submit(wait_at, gate, "earlier", fraction=0.5)
    eventually(lambda: "earlier" in ray.get(gate.arrived.remote()), 90)
    later = keeper.submit(gpus_seen, fraction=0.25)  # a lent lease, but "earlier" runs
    assert ray.get(later, timeout=60)
    assert lent(keeper).launched == 0
    ray.get(gate.open.remote())
    ray.get(earlier, timeout=60)
    assert ray.get(keeper.submit(gpus_seen, fraction=0.25), timeout=60)
    assert lent(keeper).launched == 1  # nothing unfinished there: launched here again


def test_a_recall_takes_back_idle_lent_leases_at_once_and_busy_ones_as_they_end(
    pool: RayGPUPool, keeper: RayGPUPool
) -> None:
    gate = ray.remote(num_cpus=0)(Gate).remote()
    lend_one(keeper, gpus=1)
    busy = keeper.submit(wait_at, gate, "busy", gpus=1)  # on the lent lease
    eventually(lambda: "busy" in ray.get(gate.arrived.remote()), 90)
    assert lent(keeper).launched == 1 and lent(keeper).held() == (0, 1)
    # Another driver's task waits for all four GPUs' worth: the scheduler recalls.
    wide = [pool.submit(gpus_seen, gpus=2) for _ in range(2)]
    eventually(lambda: len(lent(keeper)._recalled) == 1)  # busy: it goes back when it ends
    after = keeper.submit(gpus_seen, gpus=1)  # recalled: through the client, queued
    assert lent(keeper).launched == 1
    ray.get(gate.open.remote())
    assert ray.get(busy, timeout=60) > 0
    assert [len(gpus) for gpus in ray.get(wide, timeout=60)] == [2, 2]
    assert ray.get(after, timeout=60)
    assert lent(keeper).launched == 1
    assert not lent(keeper)._recalled  # given back as its task ended (wide ran on its GPU)


def test_idle_lent_leases_go_back_after_keep_s(pool: RayGPUPool) -> None:
    brief = hwpool.ray.connect(namespace=pool.namespace, keep_s=5)
    try:
        lend_one(brief, fraction=0.5)
        assert len(pool.snapshot().leases) == 1
        eventually(lambda: not pool.snapshot().leases)  # after 5 to 10 s
        assert lent(brief).held() == (0, 0)
    finally:
        brief.close()


def stopped_when(end: Callable[[RayGPUPool], None], pool: RayGPUPool, keeper: RayGPUPool) -> None:
    """A task the driver launched on a lent lease is stopped by ``end(keeper)``, its process
    ended and its lease freed."""
    gate = ray.remote(num_cpus=0)(Gate).remote()
    lend_one(keeper, fraction=0.5)
    running = keeper.submit(wait_at, gate, "running", fraction=0.5)
    eventually(lambda: "running" in ray.get(gate.arrived.remote()), 90)
    assert lent(keeper).launched == 1
    pid = ray.get(gate.arrived.remote())["running"]
    end(keeper)
    eventually(lambda: pid_is_gone(pid))
    with pytest.raises(ray.exceptions.RayError):
        ray.get(running, timeout=60)
    eventually(lambda: free_everywhere(pool))


def test_close_stops_the_tasks_the_driver_launched_on_lent_leases(
    pool: RayGPUPool, keeper: RayGPUPool
) -> None:
    stopped_when(RayGPUPool.close, pool, keeper)


def test_when_the_client_dies_the_driver_stops_what_it_launched_there(
    pool: RayGPUPool, keeper: RayGPUPool
) -> None:
    # The scheduler frees a dead client's leases: nothing may run on them any more.
    stopped_when(lambda keeper: ray.kill(keeper._client), pool, keeper)


def test_close_cancels_no_task_that_has_ended(
    keeper: RayGPUPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray may call back after ray.get returned; a cancel crossing a task's last reply can
    # crash the driver (ray-project/ray#54527), so an ended task is never cancelled.
    from hwpool.ray import _lending  # noqa: PLC0415

    lend_one(keeper, fraction=0.5)
    monkeypatch.setattr(_lending.LentLeases, "_ended", lambda *args: None)  # no callback
    cancelled: list[Any] = []
    monkeypatch.setattr(_lending._api, "cancel", lambda ref, force: cancelled.append(ref))
    assert ray.get(keeper.submit(gpus_seen, fraction=0.5), timeout=60)
    assert lent(keeper).held() == (0, 1)  # ended, but Ray has not said so here
    keeper.close()
    assert cancelled == []


def test_copies_of_the_pool_in_tasks_never_launch_on_lent_leases(keeper: RayGPUPool) -> None:
    lend_one(keeper, fraction=0.25)
    numbers = ray.get(keeper.submit(lease_numbers, keeper, gpus=1), timeout=60)
    assert len(numbers) == 2  # the copy's snapshot works; the copy has no lent leases
    copy = ray.cloudpickle.loads(ray.cloudpickle.dumps(keeper))
    assert copy._lent is None
    never = hwpool.ray.connect(namespace=keeper.namespace, keep_s=0)
    try:
        assert never._lent is None  # keep_s=0: nothing is kept, so nothing is lent
    finally:
        never.close()
