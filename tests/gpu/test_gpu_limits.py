"""Time limits through the in-process front (issue 23): ``limit_s=`` on every acquire and
lease sets ``Demand.limit``, and the pool revokes a grant once it has been held that long:
its capacity goes back, ``lease.revoked`` turns True, and its release is a no-op, once.

Most tests move the pool's clock by hand and call ``check_limits()`` (deterministic); the
``make_pool`` ones run on the real clock over both backends (in-process and a real
``hwpool serve``), waiting (bounded) for the grant that the revocation lets through.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest

from hostserver import MakePool
from hwpool import GPUInfo, GPUPool
from hwpool._backends._local import LocalBackend

BOUND = 10.0


def _pool(clock: list[float], num_gpus: int = 1) -> tuple[GPUPool, LocalBackend]:
    """A pool on a clock the test moves (its limits' thread sees only that clock)."""
    gpus = tuple(GPUInfo(i, str(i)) for i in range(num_gpus))
    backend = LocalBackend(gpus, clock=lambda: clock[0])
    return GPUPool(backend=backend), backend


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread; its result (or exception) lands in the list."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # the test looks at it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_queued(pool: GPUPool, count: int) -> None:
    """Wait (bounded) until ``count`` requests wait in ``pool``."""
    done = threading.Event()
    for _ in range(100_000):
        if len(pool.snapshot().waiting) >= count:
            done.set()
            break
        done.wait(0.001)
    assert done.is_set(), f"{count} waiters never queued"


def test_a_lease_held_past_its_limit_is_revoked_and_the_next_one_starts() -> None:
    clock = [0.0]
    pool, backend = _pool(clock)
    lease = pool.lease(1.0, limit_s=10)
    assert lease.limit_s == 10.0
    with lease as gpus:
        assert gpus == [0] and not lease.revoked
        thread, out = _in_thread(lambda: pool.acquire_blocking(1.0, timeout=BOUND))
        _wait_queued(pool, 1)
        clock[0] = 9.5
        backend.check_limits()
        assert not lease.revoked and pool.snapshot().free == (0.0,)  # not due yet
        clock[0] = 10.0
        backend.check_limits()
        thread.join(BOUND)
        assert out == [0]  # the waiter got the GPU the limit took back
        assert lease.revoked
    # Leaving the block released nothing: the GPU stays the waiter's.
    snap = pool.snapshot()
    assert lease.revoked and snap.free == (0.0,) and snap.revoked == 1
    assert (snap.granted, snap.released) == (2, 1)
    pool.release(0)
    assert pool.snapshot().free == (1.0,)


def test_a_lease_released_in_time_is_not_revoked() -> None:
    clock = [0.0]
    pool, backend = _pool(clock)
    with pool.lease(0.5, limit_s=5) as first:
        assert first == [0]
    with pool.lease(0.5) as again:  # a new grant (no limit) on the same GPU
        clock[0] = 100.0
        backend.check_limits()
        assert pool.snapshot().free == (0.5,)  # the old deadline revokes nothing
        assert again == [0]
    assert pool.snapshot().revoked == 0 and pool.snapshot().free == (1.0,)


def test_async_lease_is_revoked_without_cancelling_its_task() -> None:
    clock = [0.0]
    pool, backend = _pool(clock)

    async def main() -> None:
        async with pool.lease(limit_s=2) as lease_gpus:
            assert lease_gpus == [0]
            head = asyncio.create_task(pool.acquire(timeout=BOUND))
            async with asyncio.timeout(BOUND):
                while not pool.snapshot().waiting:
                    await asyncio.sleep(0)
            clock[0] = 2.0
            backend.check_limits()
            assert await head == 0
            await asyncio.sleep(0)  # the holder's task runs on: nothing was cancelled
        pool.release(0)

    asyncio.run(main())
    assert pool.snapshot().free == (1.0,) and pool.snapshot().revoked == 1


def test_acquire_with_a_limit_then_release_is_a_no_op_once() -> None:
    clock = [0.0]
    pool, backend = _pool(clock)
    gpu = pool.acquire_blocking(0.25, limit_s=1.0)
    clock[0] = 1.0
    backend.check_limits()
    assert pool.snapshot().free == (1.0,)
    pool.release(gpu, 0.25)  # revoked: a no-op
    with pytest.raises(ValueError, match=r"no grant of 0\.25 on GPU 0"):
        pool.release(gpu, 0.25)  # but only once
    assert pool.snapshot().free == (1.0,)


def test_acquire_full_released_in_part_then_revoked() -> None:
    clock = [0.0]
    pool, backend = _pool(clock, num_gpus=2)
    gpus = pool.acquire_full_blocking(2, limit_s=3.0)
    assert gpus == [0, 1]
    pool.release(0)
    clock[0] = 3.0
    backend.check_limits()
    assert pool.snapshot().free == (1.0, 1.0) and pool.snapshot().revoked == 1
    pool.release(1)  # the part still held when it was revoked: a no-op
    for gpu in (0, 1):
        with pytest.raises(ValueError, match=f"on GPU {gpu}"):
            pool.release(gpu)
    assert pool.snapshot().free == (1.0, 1.0)


def test_nowait_and_full_leases_take_limits() -> None:
    clock = [0.0]
    pool, backend = _pool(clock, num_gpus=2)
    gpu = pool.acquire_nowait(0.5, limit_s=1)
    full = pool.lease_full(1, limit_s=2)
    with full:
        clock[0] = 1.0
        backend.check_limits()
        assert not full.revoked and pool.snapshot().free[gpu] == 1.0
        clock[0] = 2.0
        backend.check_limits()
        assert full.revoked
    assert pool.snapshot().free == (1.0, 1.0) and pool.snapshot().revoked == 2
    pool.release(gpu, 0.5)


@pytest.mark.parametrize(
    ("value", "error", "shown"),
    [
        (0, ValueError, "got 0"),
        (-1, ValueError, "got -1"),
        (math.inf, ValueError, "got inf"),
        (float("nan"), ValueError, "got nan"),
        ("5", TypeError, "got '5'"),
        (True, TypeError, "got True"),
    ],
)
def test_bad_limits_are_refused_naming_limit_s(
    value: object, error: type[Exception], shown: str
) -> None:
    pool = GPUPool(1)
    calls: list[Callable[[], object]] = [
        lambda: pool.acquire_blocking(limit_s=value),  # type: ignore[arg-type]
        lambda: pool.acquire_full_blocking(1, limit_s=value),  # type: ignore[arg-type]
        lambda: pool.acquire_nowait(limit_s=value),  # type: ignore[arg-type]
        lambda: pool.acquire_full_nowait(1, limit_s=value),  # type: ignore[arg-type]
        lambda: pool.lease(limit_s=value),  # type: ignore[arg-type]
        lambda: pool.lease_full(1, limit_s=value),  # type: ignore[arg-type]
        lambda: asyncio.run(pool.acquire(limit_s=value)),  # type: ignore[arg-type]
        lambda: asyncio.run(pool.acquire_full(1, limit_s=value)),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(error, match="limit_s") as caught:
            call()
        assert shown in str(caught.value)
    snap = pool.snapshot()
    assert snap.free == (1.0,) and snap.granted == 0 and not snap.waiting


def test_limits_on_the_real_clock(make_pool: MakePool) -> None:
    """On both backends: a lease past its limit is revoked by the pool (its thread, or the
    host server) and the waiter behind it is granted; the late release is a no-op."""
    pool = make_pool(1)
    lease = pool.lease(1.0, limit_s=0.2)
    with lease:
        assert pool.acquire_blocking(1.0, timeout=BOUND) == 0  # granted once revoked
        assert lease.revoked
    assert pool.snapshot().revoked == 1
    pool.release(0)
