"""The GPUPool front over its backend: construction, detection kept on the pool, close, releases
tied to grants, balanced counters, blocking calls refused on an event loop, exact capacity and
the numeric tower."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from hostserver import MakePool
from hwpool import (
    UNITS_PER_GPU,
    GPUInfo,
    GPUPool,
    PoolClosedError,
    WouldBlock,
    current_gpus,
)
from hwpool._backends._local import LocalBackend
from hwpool._core._capacity import fraction_to_units

BOUND = 5.0


def run(coro: object) -> object:
    async def bounded() -> object:
        async with asyncio.timeout(BOUND):
            return await coro  # type: ignore[misc]

    return asyncio.run(bounded())


# ----------------------------------------------------------------- the seam
def test_a_pool_over_a_given_backend_uses_it() -> None:
    gpus = (GPUInfo(0, "GPU-a", "GPU-a", 80_000), GPUInfo(1, "GPU-b", "GPU-b", 80_000))
    backend = LocalBackend(gpus)
    pool = GPUPool(backend=backend)
    assert pool.num_gpus == 2 and pool.gpus == gpus
    with pool.lease_full(2) as held:
        assert held == [0, 1] == current_gpus()
        assert backend.snapshot().free == (0.0, 0.0)
    assert backend.snapshot().free == (1.0, 1.0)


def test_num_gpus_and_backend_are_exclusive() -> None:
    with pytest.raises(TypeError, match="num_gpus or backend"):
        GPUPool(2, backend=LocalBackend((GPUInfo(0, "0"),)))


def test_logical_pool_lists_logical_gpus() -> None:
    assert GPUPool(3).gpus == (GPUInfo(0, "0"), GPUInfo(1, "1"), GPUInfo(2, "2"))


def test_detected_pool_keeps_what_detection_found(fake_smi: object) -> None:
    fake_smi(  # type: ignore[operator]
        'echo "0, GPU-11111111, H100, 81559, 1024, 479"\n'
        'echo "1, GPU-22222222, H100, 81559, [N/A], [N/A]"\n'
    )
    pool = GPUPool()
    assert pool.gpus == (
        GPUInfo(
            0, "0", "GPU-11111111", 81559, "H100", memory_used_mib=1024, memory_reserved_mib=479
        ),
        GPUInfo(1, "1", "GPU-22222222", 81559, "H100"),
    )


def test_pool_with_no_visible_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: one logical GPU "0", so that a child ran on the GPU this process was denied.
    monkeypatch.delenv("HWPOOL_NUM_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    with pytest.raises(ValueError, match=r"GPUPool\(\): CUDA_VISIBLE_DEVICES='-1': entry '-1' is"):
        GPUPool()
    assert GPUPool(2).gpus == (GPUInfo(0, "0"), GPUInfo(1, "1"))  # logical GPUs, asked for


def test_close_refuses_new_requests_and_wakes_waiters(make_pool: MakePool) -> None:
    pool = make_pool(1)

    async def main() -> None:
        gpu = await pool.acquire(1.0)
        waiter = asyncio.create_task(pool.acquire(0.5))
        while not pool.snapshot().waiting:
            await asyncio.sleep(0)
        pool.close()
        with pytest.raises(PoolClosedError):
            await waiter
        with pytest.raises(PoolClosedError):
            await pool.acquire(0.5)
        with pytest.raises(PoolClosedError):
            pool.acquire_nowait(0.5)
        pool.release(gpu)  # what is held can still be given back
        pool.close()  # idempotent

    run(main())
    assert pool.snapshot().waiting == ()


def test_pool_is_a_context_manager_that_closes(make_pool: MakePool) -> None:
    with make_pool(1) as pool:
        assert pool.acquire_nowait(0.5) == 0
    with pytest.raises(PoolClosedError):
        pool.acquire_nowait(0.5)


# ----------------------------------------------------------------- release tied to grants
def test_release_cannot_free_a_live_lease(make_pool: MakePool) -> None:
    # Before: release(0, 0.5) freed the lease's units, a whole GPU was granted on top of the
    # live lease, and the lease's own exit raised.
    pool = make_pool(1)
    with pool.lease(0.5):
        with pytest.raises(ValueError, match=r"hold no grant of 0\.5 on GPU 0"):
            pool.release(0, 0.5)
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(1.0)
    assert pool.snapshot().free == (1.0,)


def test_release_twice_raises_and_changes_nothing(make_pool: MakePool) -> None:
    pool = make_pool(1)
    pool.acquire_nowait(0.5)
    other = pool.acquire_nowait(0.5)
    pool.release(other, 0.5)
    pool.release(0, 0.5)
    before = pool.snapshot()
    with pytest.raises(ValueError, match="released already"):
        pool.release(0, 0.5)
    assert pool.snapshot() == before and before.free == (1.0,)


def test_release_must_match_what_was_acquired(make_pool: MakePool) -> None:
    pool = make_pool(2)
    pool.acquire_nowait(0.25)
    pool.acquire_nowait(0.25)
    with pytest.raises(ValueError, match=r"hold no grant of 0\.5 on GPU 0"):
        pool.release(0, 0.5)  # two quarters are not a half
    pool.release(0, 0.25)
    pool.release(0, 0.25)
    assert pool.snapshot().free == (1.0, 1.0)


def test_whole_gpus_are_released_one_by_one(make_pool: MakePool) -> None:
    pool = make_pool(3)
    assert pool.acquire_full_nowait(2) == [0, 1]
    pool.release(1)
    assert pool.snapshot().free == (0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="on GPU 1"):
        pool.release(1)
    assert pool.snapshot().released == 0  # the grant is still half held
    pool.release(0)
    snap = pool.snapshot()
    assert snap.free == (1.0, 1.0, 1.0) and (snap.granted, snap.released) == (1, 1)


def test_release_wakes_the_waiter_it_frees_capacity_for(make_pool: MakePool) -> None:
    pool = make_pool(1)

    async def main() -> None:
        gpu = await pool.acquire(0.75)
        waiter = asyncio.create_task(pool.acquire(0.5))
        while not pool.snapshot().waiting:
            await asyncio.sleep(0)
        pool.release(gpu, 0.75)
        assert await waiter == 0
        pool.release(0, 0.5)

    run(main())
    assert pool.snapshot().free == (1.0,)


# ----------------------------------------------------------------- counters balance
def test_snapshot_counts_grants_on_both_sides(make_pool: MakePool) -> None:
    # Before: one lease_full(2) showed granted 1, released 2.
    pool = make_pool(2)
    with pool.lease_full(2):
        pass
    pool.acquire_full_nowait(2)
    pool.release(0)
    pool.release(1)
    with pool.lease(0.5):
        pass
    snap = pool.snapshot()
    assert (snap.granted, snap.released) == (3, 3)


# ----------------------------------------------------------------- blocking on an event loop
def test_blocking_acquire_on_an_event_loop_thread_raises_instead_of_freezing_it(
    make_pool: MakePool,
) -> None:
    # Before: the blocking forms blocked the loop (with no timeout: forever, as the holder is a
    # task of this very loop).
    pool = make_pool(1)

    async def main() -> None:
        gpu = await pool.acquire(1.0)
        with pytest.raises(RuntimeError, match="event loop"):
            pool.acquire_blocking(0.5, timeout=1.0)
        with pytest.raises(RuntimeError, match="event loop"):
            pool.acquire_full_blocking(1, timeout=1.0)
        with pytest.raises(RuntimeError, match="event loop"), pool.lease(0.5, timeout=1.0):
            pass
        pool.release(gpu)
        with pytest.raises(RuntimeError, match="event loop"):
            pool.acquire_blocking(0.5, timeout=1.0)  # refused even when it would not wait
        assert await asyncio.to_thread(pool.acquire_blocking, 0.5) == 0  # a thread is fine

    run(main())
    assert pool.snapshot().free == (0.5,)


# ----------------------------------------------------------------- exact capacity
def test_three_thirds_fill_a_gpu_exactly_and_nothing_more_fits(make_pool: MakePool) -> None:
    # Before: three Fraction(1, 3) leases left one unit free, and 1e-6 was granted on top.
    pool = make_pool(1)
    for _ in range(3):
        assert pool.acquire_nowait(Fraction(1, 3)) == 0  # type: ignore[arg-type]
    assert pool.snapshot().free == (0.0,)
    with pytest.raises(WouldBlock):
        pool.acquire_nowait(1e-6)
    with pytest.raises(WouldBlock):
        pool.acquire_nowait(1e-300)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 20, 100])
def test_n_leases_of_one_nth_fill_a_gpu_exactly(make_pool: MakePool, n: int) -> None:
    for fraction in (Fraction(1, n), 1 / n):
        pool = make_pool(1)
        for _ in range(n):
            pool.acquire_nowait(fraction)  # type: ignore[arg-type]
        assert pool.snapshot().free == (0.0,)
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(1e-9)
        pool.close()  # (a server's pools share its GPUs: give them back for the next one)


def test_demands_round_up_to_whole_units(make_pool: MakePool) -> None:
    assert fraction_to_units(0.1) == UNITS_PER_GPU // 10  # float noise is not a demand
    assert fraction_to_units(Fraction(1, 11)) == -(-UNITS_PER_GPU // 11)
    assert fraction_to_units(1e-300) == 1  # anything above zero takes at least one unit
    assert fraction_to_units(Fraction(1, 10**12)) == 1
    eleven = make_pool(1)
    for _ in range(10):
        eleven.acquire_nowait(Fraction(1, 11))  # type: ignore[arg-type]
    with pytest.raises(WouldBlock):  # rounded up: the eleventh does not fit
        eleven.acquire_nowait(Fraction(1, 11))  # type: ignore[arg-type]


# ----------------------------------------------------------------- the numeric tower
@pytest.mark.parametrize("count", [np.int64(2), np.int32(2), np.uint8(2)])
def test_numpy_integers_count_everywhere(count: object) -> None:
    pool = GPUPool(count)  # type: ignore[arg-type]
    assert pool.num_gpus == 2 and type(pool.num_gpus) is int
    assert pool.acquire_full_nowait(count) == [0, 1]  # type: ignore[arg-type]
    pool.release(np.int64(0))  # type: ignore[arg-type]
    with pool.lease(np.float32(0.5), timeout=BOUND) as gpus:  # type: ignore[arg-type]
        assert gpus == [0]


@pytest.mark.parametrize("bad", [Decimal(2), Decimal("2.0"), 2.0, "2", True, np.bool_(True)])
def test_non_integers_are_not_counts(bad: object) -> None:
    with pytest.raises(TypeError, match="num_gpus"):
        GPUPool(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="count"):
        GPUPool(2).acquire_full_nowait(bad)  # type: ignore[arg-type]


def test_decimal_fractions_are_refused_like_the_numeric_tower_does(make_pool: MakePool) -> None:
    # Decimal is not a numbers.Real; mixing it with floats is an error in Python itself.
    pool = make_pool(1)
    with pytest.raises(TypeError, match="fraction must be a real number, got Decimal"):
        pool.acquire_nowait(Decimal("0.5"))  # type: ignore[arg-type]
    assert pool.snapshot().free == (1.0,)
