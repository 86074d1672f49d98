"""Owners and priorities through the in-process front (issue 23): ``owner=``/``priority=`` on
every acquire and lease, ``GPUPool(shares=, half_life=)``, and bad values named."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from hwpool import GPUInfo, GPUPool
from hwpool._backends._local import LocalBackend

BOUND = 5.0


def _pool(clock: list[float], num_gpus: int = 1) -> GPUPool:
    """A pool on a clock the test moves, so usage (and so the order) is deterministic."""
    gpus = tuple(GPUInfo(i, str(i)) for i in range(num_gpus))
    backend = LocalBackend(gpus, clock=lambda: clock[0], shares={"b": 2.0}, half_life=60.0)
    return GPUPool(backend=backend)


async def _queued(pool: GPUPool, count: int) -> None:
    """Wait (bounded) until ``count`` requests wait in ``pool``."""
    async with asyncio.timeout(BOUND):
        while len(pool.snapshot().waiting) < count:
            await asyncio.sleep(0)


def test_leases_go_to_the_owner_with_less_usage_then_by_priority() -> None:
    clock = [0.0]
    pool = _pool(clock)
    order: list[str] = []

    async def want(name: str, owner: str, priority: int = 0) -> None:
        async with pool.lease(owner=owner, priority=priority):
            order.append(name)

    async def main() -> None:
        gpu = await pool.acquire(owner="a")
        clock[0] = 1.0  # a has used a GPU for a second; b nothing
        tasks = [asyncio.create_task(want("b", "b"))]
        await _queued(pool, 1)
        tasks.append(asyncio.create_task(want("a-low", "a")))
        await _queued(pool, 2)
        tasks.append(asyncio.create_task(want("a-high", "a", priority=3)))
        await _queued(pool, 3)
        waiting = pool.snapshot().waiting  # in queue order, with owners and priorities
        assert [(w.owner, w.priority) for w in waiting] == [("b", 0), ("a", 3), ("a", 0)]
        clock[0] = 2.0
        pool.release(gpu)
        async with asyncio.timeout(BOUND):
            await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == ["b", "a-high", "a-low"]


def test_every_acquire_takes_an_owner_and_a_priority() -> None:
    pool = GPUPool(2, shares={"x": 3}, half_life=10)
    gpu = pool.acquire_blocking(0.5, owner="x", priority=1)
    pool.release(gpu, 0.5)
    pool.release(pool.acquire_nowait(owner=("team", 7)), 1.0)
    for gpu in pool.acquire_full_nowait(2, owner="x", priority=-1):
        pool.release(gpu)
    for gpu in pool.acquire_full_blocking(1, owner="y"):
        pool.release(gpu)
    with pool.lease_full(2, owner="x", priority=2) as gpus:
        assert gpus == [0, 1]

    async def main() -> None:
        pool.release(await pool.acquire(0.25, owner="z"), 0.25)
        for gpu in await pool.acquire_full(2, owner="z", priority=4):
            pool.release(gpu)
        async with pool.lease(owner=None, priority=0):
            pass

    asyncio.run(main())
    assert pool.snapshot().free == (1.0, 1.0)


@pytest.mark.parametrize(
    ("owner", "priority", "match"),
    [
        (["a"], 0, r"owner must be hashable, got \['a'\] \(list\)"),
        ({"a"}, 0, r"owner must be hashable, got \{'a'\} \(set\)"),
        ("a", 0.5, r"priority must be an int, got 0.5 \(float\)"),
        ("a", False, r"priority must be an int, got False \(bool\)"),
        (None, "1", r"priority must be an int, got '1' \(str\)"),
    ],
)
def test_bad_owner_or_priority_is_named_and_changes_nothing(
    owner: object, priority: object, match: str
) -> None:
    pool = GPUPool(1)
    calls = [
        lambda: pool.acquire_blocking(owner=owner, priority=priority),  # type: ignore[arg-type]
        lambda: pool.acquire_nowait(owner=owner, priority=priority),  # type: ignore[arg-type]
        lambda: pool.acquire_full_nowait(1, owner=owner, priority=priority),  # type: ignore[arg-type]
        lambda: pool.acquire_full_blocking(1, owner=owner, priority=priority),  # type: ignore[arg-type]
        lambda: pool.lease(owner=owner, priority=priority),  # type: ignore[arg-type]
        lambda: pool.lease_full(1, owner=owner, priority=priority),  # type: ignore[arg-type]
        lambda: asyncio.run(pool.acquire(owner=owner, priority=priority)),  # type: ignore[arg-type]
        lambda: asyncio.run(pool.acquire_full(1, owner=owner, priority=priority)),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(TypeError, match=match):
            call()
    snap = pool.snapshot()
    assert snap.free == (1.0,) and snap.waiting == ()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shares": ["a"]}, TypeError, "shares must be a mapping of owner to share"),
        ({"shares": {"a": 0}}, ValueError, r"shares\['a'\] must be a finite number > 0, got 0"),
        ({"shares": {"a": math.nan}}, ValueError, r"shares\['a'\] must not be NaN"),
        ({"half_life": -1}, ValueError, "half_life must be a finite number of seconds > 0"),
        ({"half_life": "1h"}, TypeError, "half_life must be a real number, got '1h'"),
    ],
)
def test_bad_shares_or_half_life_are_named(
    kwargs: dict[str, object], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        GPUPool(1, **kwargs)  # type: ignore[arg-type]


def test_shares_belong_to_an_in_process_pool() -> None:
    backend = LocalBackend((GPUInfo(0, "0"),))
    with pytest.raises(TypeError, match="give backend or shares/half_life"):
        GPUPool(backend=backend, shares={"a": 2.0})


def test_blocking_waiters_of_two_owners() -> None:
    clock = [0.0]
    pool = _pool(clock)
    gpu = pool.acquire_blocking(owner="a")
    clock[0] = 5.0
    granted: list[str] = []
    lock = threading.Lock()

    def want(owner: str) -> None:
        got = pool.acquire_blocking(owner=owner, timeout=BOUND)
        with lock:
            granted.append(owner)
        pool.release(got)

    threads = [threading.Thread(target=want, args=("a",))]
    threads[0].start()
    _wait_queued(pool, 1)
    threads.append(threading.Thread(target=want, args=("b",)))
    threads[1].start()
    _wait_queued(pool, 2)
    pool.release(gpu)
    for thread in threads:
        thread.join(BOUND)
    assert granted == ["b", "a"]


def _wait_queued(pool: GPUPool, count: int) -> None:
    done = threading.Event()
    for _ in range(100_000):
        if len(pool.snapshot().waiting) >= count:
            return
        done.wait(0.001)
    raise AssertionError(f"{count} waiters never queued")
