"""GPUPool fronts: asyncio, blocking, nowait, leases, cancellation safety, snapshots."""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

import pytest

import hwpool
from hostserver import MakePool
from hwpool import GPUPool, WouldBlock, current_gpus
from hwpool._backends import _waiters as gpu_pool_module
from hwpool._backends._local import LocalBackend

BOUND = 5.0  # seconds: every wait in this module is bounded by this


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(BOUND):
            return await coro_fn()

    return asyncio.run(bounded())


async def until_queued(pool: GPUPool, n: int) -> None:
    """Yield to the loop until ``n`` requests wait in the pool (bounded)."""
    for _ in range(1000):
        if len(pool.snapshot().waiting) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never saw {n} waiters")


def free(pool: GPUPool) -> tuple[float, ...]:
    return pool.snapshot().free


# ----------------------------------------------------------------- basics
def test_acquire_and_release_fraction(make_pool: MakePool) -> None:
    pool = make_pool(2)

    async def main() -> None:
        a = await pool.acquire(0.5)
        b = await pool.acquire(0.3)
        assert (a, b) == (0, 0)  # best fit: the half-used GPU
        assert free(pool) == pytest.approx((0.2, 1.0))
        pool.release(a, 0.5)
        pool.release(b, 0.3)
        assert free(pool) == (1.0, 1.0)

    run(main)


def test_acquire_full_then_fraction_waits_then_is_granted(make_pool: MakePool) -> None:
    pool = make_pool(2)

    async def main() -> None:
        gpus = await pool.acquire_full(2)
        assert gpus == [0, 1]
        waiter = asyncio.create_task(pool.acquire(0.5))
        await until_queued(pool, 1)
        pool.release(1)
        assert await waiter == 1
        pool.release(0)
        pool.release(1, 0.5)
        assert free(pool) == (1.0, 1.0)

    run(main)


def test_num_gpus_and_repr() -> None:
    pool = GPUPool(3)
    assert pool.num_gpus == 3 and "3" in repr(pool)


def test_pool_detects_count_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPOOL_NUM_GPUS", "5")
    assert GPUPool().num_gpus == 5


def test_pool_with_no_visible_gpu_is_refused_unless_logical(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: one logical GPU, whose children were given CUDA_VISIBLE_DEVICES=0.
    monkeypatch.delenv("HWPOOL_NUM_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES='': empty"):
        GPUPool()
    monkeypatch.setenv("HWPOOL_NUM_GPUS", "3")  # logical GPUs asked for still work
    assert GPUPool().num_gpus == 3


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("fraction", "error"),
    [(0, ValueError), (-0.5, ValueError), (1.01, ValueError), (math.nan, ValueError),
     (math.inf, ValueError), (True, TypeError), ("0.5", TypeError),
     (Decimal("0.5"), TypeError)],
)  # fmt: skip
def test_bad_fraction_rejected_everywhere(
    make_pool: MakePool, fraction: object, error: type[Exception]
) -> None:
    pool = make_pool(2)
    before = pool.snapshot()
    with pytest.raises(error, match="fraction"):
        pool.acquire_nowait(fraction)  # type: ignore[arg-type]
    with pytest.raises(error, match="fraction"):
        pool.acquire_blocking(fraction)  # type: ignore[arg-type]
    with pytest.raises(error, match="fraction"):
        pool.lease(fraction)  # type: ignore[arg-type]
    with pytest.raises(error, match="fraction"):
        run(lambda: pool.acquire(fraction))  # type: ignore[arg-type]
    with pytest.raises(error, match="fraction"):
        pool.release(0, fraction)  # type: ignore[arg-type]
    assert pool.snapshot() == before


def test_fraction_none_is_the_default_whole_gpu(make_pool: MakePool) -> None:
    # fraction=None is the default since memory= became its alternative: one whole GPU.
    pool = make_pool(1)
    assert pool.acquire_nowait(None) == 0
    assert pool.snapshot().free == (0.0,)
    pool.release(0, None)
    assert pool.snapshot().free == (1.0,)


@pytest.mark.parametrize("count", [0, -1, 3])
def test_bad_count_names_both_numbers(make_pool: MakePool, count: int) -> None:
    pool = make_pool(2)
    message = f"between 1 and num_gpus=2, got {count}"
    with pytest.raises(ValueError, match=message):
        pool.acquire_full_nowait(count)
    with pytest.raises(ValueError, match=message):
        pool.lease_full(count)
    with pytest.raises(ValueError, match=message):
        run(lambda: pool.acquire_full(count))


def test_count_must_be_int(make_pool: MakePool) -> None:
    pool = make_pool(2)
    with pytest.raises(TypeError, match="count"):
        pool.acquire_full_nowait(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="count"):
        pool.acquire_full_nowait(True)


@pytest.mark.parametrize("timeout", [-1, math.nan, math.inf, "1"])
def test_bad_timeout_rejected(make_pool: MakePool, timeout: object) -> None:
    pool = make_pool(1)
    with pytest.raises((ValueError, TypeError), match="timeout"):
        pool.acquire_blocking(0.5, timeout=timeout)  # type: ignore[arg-type]
    assert pool.snapshot().free == (1.0,)


@pytest.mark.parametrize(
    ("gpu", "fraction", "error", "message"),
    [(2, 0.1, ValueError, "gpu_id"), (-1, 0.1, ValueError, "gpu_id"),
     ("0", 0.1, TypeError, "gpu_id"), (0, 0.6, ValueError, "hold no grant of 0.6 on GPU 0"),
     (1, 0.5, ValueError, "hold no grant of 0.5 on GPU 1")],
)  # fmt: skip
def test_bad_release_changes_nothing(
    make_pool: MakePool, gpu: object, fraction: float, error: type[Exception], message: str
) -> None:
    pool = make_pool(2)
    pool.acquire_nowait(0.5)
    before = pool.snapshot()
    with pytest.raises(error, match=message):
        pool.release(gpu, fraction)  # type: ignore[arg-type]
    assert pool.snapshot() == before


@pytest.mark.parametrize("num_gpus", [0, -2])
def test_pool_rejects_bad_size(num_gpus: int) -> None:
    with pytest.raises(ValueError, match=f"num_gpus must be >= 1, got {num_gpus}"):
        GPUPool(num_gpus)


def test_pool_rejects_non_int_size() -> None:
    with pytest.raises(TypeError, match="num_gpus"):
        GPUPool(2.0)  # type: ignore[arg-type]


# ----------------------------------------------------------------- nowait
def test_nowait_grants_or_raises_wouldblock(make_pool: MakePool) -> None:
    pool = make_pool(1)
    assert pool.acquire_nowait(0.7) == 0
    with pytest.raises(WouldBlock):
        pool.acquire_nowait(0.5)
    with pytest.raises(WouldBlock):
        pool.acquire_full_nowait(1)
    assert pool.snapshot().free == pytest.approx((0.3,))


def test_nowait_never_jumps_the_queue() -> None:
    # A fresh in-process pool knows no hold times, so nothing may backfill onto the head's
    # GPU (rule 4e; a shared server would have learned some, and decide by them).
    pool = GPUPool(2)

    async def main() -> None:
        pool.acquire_nowait(0.5)
        pool.acquire_nowait(0.6)  # GPU0: 0.5 free, GPU1: 0.4 free
        head = asyncio.create_task(pool.acquire(0.6))  # reserves GPU 0
        await until_queued(pool, 1)
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(0.45)  # fits on GPU 0 only, which is reserved
        assert pool.acquire_nowait(0.3) == 1  # backfill on the unreserved GPU
        pool.release(0, 0.5)
        assert await head == 0

    run(main)


def test_nowait_after_release_does_not_oversubscribe(make_pool: MakePool) -> None:
    # The release hands the GPU to the waiter before it runs: a nowait caller must not take it.
    pool = make_pool(1)

    async def main() -> None:
        pool.acquire_nowait(1.0)
        waiter = asyncio.create_task(pool.acquire(1.0))
        await until_queued(pool, 1)
        pool.release(0)
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(0.1)
        assert await waiter == 0

    run(main)


# ----------------------------------------------------------------- the cases via the pool
def test_three_busy_gpus_the_whole_request_keeps_its_gpus_and_a_fraction_backfills(
    make_pool: MakePool,
) -> None:
    pool = make_pool(3)

    async def main() -> None:
        for _ in range(3):
            pool.acquire_nowait(1.0)
        t1 = asyncio.create_task(pool.acquire_full(2))  # the head: reserves GPUs 0-1
        await until_queued(pool, 1)
        t2 = asyncio.create_task(pool.acquire(0.5))
        await until_queued(pool, 2)
        pool.release(2)  # not the head's: the fraction behind it takes it
        assert await t2 == 2
        pool.release(1)
        assert not t1.done()
        pool.release(0)
        assert sorted(await t1) == [0, 1]

    run(main)


# ----------------------------------------------------------------- timeouts and cancellation
def test_async_timeout_raises_and_leaves_no_trace(make_pool: MakePool) -> None:
    pool = make_pool(1)

    async def main() -> None:
        pool.acquire_nowait(1.0)
        with pytest.raises(TimeoutError):
            await pool.acquire(0.5, timeout=0.01)
        snap = pool.snapshot()
        assert snap.waiting == () and snap.timed_out == 1 and snap.cancelled == 0

    run(main)


def test_timeout_zero_grants_when_free(make_pool: MakePool) -> None:
    pool = make_pool(1)
    assert run(lambda: pool.acquire(0.5, timeout=0)) == 0


def test_cancel_before_first_step_leaves_no_trace(make_pool: MakePool) -> None:
    pool = make_pool(1)

    async def main() -> None:
        task = asyncio.create_task(pool.acquire(0.5))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.snapshot().free == (1.0,)

    run(main)


def test_cancel_while_waiting_withdraws_reservation(make_pool: MakePool) -> None:
    pool = make_pool(2)

    async def main() -> None:
        pool.acquire_nowait(0.5)
        pool.acquire_nowait(0.6)
        head = asyncio.create_task(pool.acquire(0.6))  # reserves one GPU (0 if nothing known)
        await until_queued(pool, 1)
        assert len(pool.snapshot().waiting[0].reserved) == 1
        head.cancel()
        with pytest.raises(asyncio.CancelledError):
            await head
        snap = pool.snapshot()
        assert snap.waiting == () and snap.cancelled == 1
        assert pool.acquire_nowait(0.45) == 0  # GPU 0 usable again

    run(main)


def test_cancel_after_grant_before_resume_gives_capacity_back(make_pool: MakePool) -> None:
    # The race of asyncio.Semaphore's history: granted, then cancelled before it ran.
    pool = make_pool(1)

    async def main() -> None:
        pool.acquire_nowait(1.0)
        waiter = asyncio.create_task(pool.acquire(1.0))
        behind = asyncio.create_task(pool.acquire(1.0))
        await until_queued(pool, 2)
        pool.release(0)  # grants `waiter` and resolves its future...
        waiter.cancel()  # ...but it is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert await behind == 0  # the grant went on to the next waiter
        pool.release(0)
        assert pool.snapshot().free == (1.0,)

    run(main)


def test_outer_asyncio_timeout_cancels_cleanly(make_pool: MakePool) -> None:
    pool = make_pool(1)

    async def main() -> None:
        pool.acquire_nowait(1.0)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await pool.acquire(0.5)
        assert pool.snapshot().waiting == ()
        pool.release(0)
        assert pool.snapshot().free == (1.0,)

    run(main)


@pytest.mark.parametrize("release_at", [None, 0, 1, 2, 3])
@pytest.mark.parametrize("cancel_at", [0, 1, 2, 3, 4])
def test_cancel_at_every_await_point_of_a_lease(
    make_pool: MakePool, release_at: int | None, cancel_at: int
) -> None:
    """Cancel a lease user before it starts, while queued, after its grant but before it resumes,
    or inside the body, with the GPU freed before or after; nothing may leak or linger."""
    pool = make_pool(1)
    pool.acquire_nowait(1.0)

    async def main() -> None:
        async def user() -> None:
            async with pool.lease(0.5):
                await asyncio.Event().wait()

        task = asyncio.create_task(user())
        for step in range(5):
            if step == release_at:
                pool.release(0)
            if step == cancel_at:
                task.cancel()
            await asyncio.sleep(0)
        with pytest.raises(asyncio.CancelledError):
            await task
        if release_at is None:
            pool.release(0)
        snap = pool.snapshot()
        assert snap.free == (1.0,) and snap.waiting == ()

    run(main)


# ----------------------------------------------------------------- leases and current_gpus
def test_async_lease_exposes_gpus_and_sets_current_gpus(make_pool: MakePool) -> None:
    pool = make_pool(4)

    async def main() -> None:
        lease = pool.lease_full(2)
        assert lease.gpus == [] and lease.fraction == 1.0
        assert current_gpus() == []
        async with lease as gpus:
            assert gpus == lease.gpus == [0, 1] == current_gpus()
            async with pool.lease(0.25) as inner:
                assert current_gpus() == inner == [2]
            assert current_gpus() == [0, 1]
        assert current_gpus() == [] and lease.gpus == []
        assert pool.snapshot().free == (1.0,) * 4

    run(main)


def test_current_gpus_follows_tasks_and_copied_contexts(make_pool: MakePool) -> None:
    pool = make_pool(2)

    async def main() -> None:
        async with pool.lease(0.5):
            child = asyncio.create_task(asyncio.to_thread(current_gpus))
            assert await child == [0]
            ctx = contextvars.copy_context()
        assert ctx.run(current_gpus) == [0]
        assert current_gpus() == []

    run(main)


def test_blocking_lease_and_release_on_error(make_pool: MakePool) -> None:
    pool = make_pool(2)
    lease = pool.lease(0.4)
    with pytest.raises(ZeroDivisionError), lease as gpus:
        assert gpus == [0] and current_gpus() == [0] and lease.fraction == 0.4
        1 / 0  # noqa: B018
    assert pool.snapshot().free == (1.0, 1.0)
    with pytest.raises(RuntimeError, match="only once"), lease:
        pass
    assert pool.snapshot().free == (1.0, 1.0)


def test_lease_timeout(make_pool: MakePool) -> None:
    pool = make_pool(1)
    pool.acquire_nowait(1.0)
    with pytest.raises(TimeoutError), pool.lease(0.5, timeout=0.01):
        pass
    assert pool.snapshot().timed_out == 1 and pool.snapshot().waiting == ()


# ----------------------------------------------------------------- blocking front and threads
def test_blocking_acquire_woken_by_release_from_another_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = GPUPool(1)
    pool.acquire_blocking(1.0)
    result: list[int] = []
    done = threading.Event()
    parked = threading.Event()

    class ParkingEvent(threading.Event):
        """The waiter's own event: says when the waiter is about to sleep on it."""

        def wait(self, timeout: float | None = None) -> bool:
            parked.set()
            return super().wait(timeout)

    def worker() -> None:
        result.append(pool.acquire_blocking(0.5, timeout=BOUND))
        done.set()

    monkeypatch.setattr(gpu_pool_module.threading, "Event", ParkingEvent)
    thread = threading.Thread(target=worker)
    thread.start()
    assert parked.wait(BOUND)
    assert len(pool.snapshot().waiting) == 1
    pool.release(0)
    assert done.wait(BOUND) and result == [0]
    thread.join(BOUND)


def test_blocking_timeout_withdraws(make_pool: MakePool) -> None:
    pool = make_pool(1)
    pool.acquire_full_blocking(1)
    with pytest.raises(TimeoutError, match="timeout"):
        pool.acquire_blocking(0.5, timeout=0.01)
    with pytest.raises(TimeoutError):
        pool.acquire_full_blocking(1, timeout=0)
    snap = pool.snapshot()
    assert snap.waiting == () and snap.timed_out == 2


def test_keyboard_interrupt_in_blocking_wait_leaves_no_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class InterruptedEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            raise KeyboardInterrupt

    monkeypatch.setattr(gpu_pool_module.threading, "Event", InterruptedEvent)
    pool = GPUPool(1)
    pool.acquire_nowait(1.0)
    with pytest.raises(KeyboardInterrupt):
        pool.acquire_blocking(0.5)
    snap = pool.snapshot()
    assert snap.waiting == () and snap.cancelled == 1
    pool.release(0)
    assert pool.snapshot().free == (1.0,)


def test_keyboard_interrupt_after_grant_gives_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = GPUPool(1)
    pool.acquire_nowait(1.0)

    class GrantThenInterrupt(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            pool.release(0)  # the grant lands on this waiter...
            raise KeyboardInterrupt  # ...and Ctrl-C arrives before it returns

    monkeypatch.setattr(gpu_pool_module.threading, "Event", GrantThenInterrupt)
    with pytest.raises(KeyboardInterrupt):
        pool.acquire_blocking(1.0)
    assert pool.snapshot().free == (1.0,)


def test_grants_cross_event_loops_in_other_threads(make_pool: MakePool) -> None:
    pool = make_pool(1)
    pool.acquire_nowait(1.0)
    got: list[int] = []
    parked = threading.Event()

    def other_loop() -> None:
        async def main() -> None:
            task = asyncio.create_task(pool.acquire(0.5, timeout=BOUND))
            await until_queued(pool, 1)
            parked.set()
            got.append(await task)

        asyncio.run(main())

    thread = threading.Thread(target=other_loop)
    thread.start()
    assert parked.wait(BOUND)
    pool.release(0)  # from this thread: resolved through call_soon_threadsafe
    thread.join(BOUND)
    assert got == [0] and not thread.is_alive()


def test_grant_to_waiter_on_closed_loop_is_given_back(make_pool: MakePool) -> None:
    pool = make_pool(1)
    pool.acquire_nowait(1.0)
    loop = asyncio.new_event_loop()
    task = loop.create_task(pool.acquire(0.5))
    loop.run_until_complete(until_queued(pool, 1))
    loop.close()
    pool.release(0)  # the waiter's loop is gone: its grant must come back
    assert pool.snapshot().free == (1.0,)
    assert not task.done()


def test_many_threads_share_one_pool(make_pool: MakePool) -> None:
    pool = make_pool(2)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(50):
                if i % 5 == 0:
                    with pool.lease_full(2, timeout=BOUND):
                        pass
                else:
                    with pool.lease(0.3, timeout=BOUND) as gpus:
                        assert len(gpus) == 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND * 4)
    assert not errors and not any(t.is_alive() for t in threads)
    snap = pool.snapshot()
    assert snap.free == (1.0, 1.0) and snap.granted == 400 and snap.waiting == ()


# ----------------------------------------------------------------- snapshot
def test_snapshot_reports_queue_and_counters(make_pool: MakePool) -> None:
    pool = make_pool(2)

    async def main() -> None:
        a = await pool.acquire(0.7)
        b = await pool.acquire(0.7)
        waiter = asyncio.create_task(pool.acquire_full(2))
        await until_queued(pool, 1)
        snap = pool.snapshot()
        assert snap.num_gpus == 2 and snap.free == pytest.approx((0.3, 0.3))
        (entry,) = snap.waiting
        assert (entry.count, entry.fraction, entry.reserved) == (2, 1.0, (0, 1))
        assert entry.waited_s >= 0
        assert (snap.granted, snap.released, snap.cancelled, snap.timed_out) == (2, 0, 0, 0)
        pool.release(a, 0.7)
        pool.release(b, 0.7)
        assert await waiter == [0, 1]
        with pytest.raises(AttributeError):
            snap.granted = 5  # type: ignore[misc]

    run(main)


def test_public_names_are_exported() -> None:
    for name in hwpool.__all__:
        assert hasattr(hwpool, name), name


# ----------------------------------------------------------------- hold-time hints
@pytest.mark.parametrize(
    ("bad", "error"),
    [(-1.0, ValueError), (math.inf, ValueError), (math.nan, ValueError), ("5", TypeError)],
)
def test_a_bad_expected_s_is_refused_naming_it_and_changes_nothing(
    bad: object, error: type[Exception]
) -> None:
    pool = GPUPool(1)
    calls = [
        lambda: pool.acquire_nowait(0.5, expected_s=bad),  # type: ignore[arg-type]
        lambda: pool.acquire_full_nowait(1, expected_s=bad),  # type: ignore[arg-type]
        lambda: pool.acquire_blocking(0.5, expected_s=bad),  # type: ignore[arg-type]
        lambda: pool.lease(0.5, expected_s=bad),  # type: ignore[arg-type]
        lambda: pool.lease_full(1, expected_s=bad),  # type: ignore[arg-type]
        lambda: asyncio.run(pool.acquire(0.5, expected_s=bad)),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(error, match="expected_s"):
            call()
    snap = pool.snapshot()
    assert snap.free == (1.0,) and snap.waiting == () and snap.granted == 0


def test_a_limit_lets_short_work_backfill_onto_the_heads_gpu() -> None:
    """Only an enforced limit that ends by the head's shadow passes it (issue 23): a hint
    (``expected_s``) promises nothing, however short."""
    clock = [0.0]
    pool = GPUPool(backend=LocalBackend(GPUPool(1).gpus, clock=lambda: clock[0]))

    async def main() -> None:
        pool.acquire_nowait(0.6, expected_s=10.0)
        head = asyncio.create_task(pool.acquire(1.0))  # the head: its shadow is 10
        await until_queued(pool, 1)
        clock[0] = 1.0
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(0.1)  # nothing learned: no promise that it ends in time
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(0.1, expected_s=0.01)  # a hint is not enforced
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(0.1, limit_s=50.0)  # would end past the shadow
        async with pool.lease(0.1, limit_s=5.0) as gpus:  # ends by 6, surely
            assert gpus == [0]
        pool.release(0, 0.6)
        assert await head == 0

    run(main)


def test_a_hint_travels_to_either_backend(make_pool: MakePool) -> None:
    pool = make_pool(2)

    async def main() -> None:
        assert pool.acquire_nowait(0.5, expected_s=3.0) == 0
        assert pool.acquire_full_nowait(1, expected_s=0.0) == [1]
        async with pool.lease(0.25, expected_s=2.5) as gpus:
            assert gpus == [0]
        pool.release(0, 0.5)
        pool.release(1)
        assert await pool.acquire_full(2, expected_s=1.0) == [0, 1]
        pool.release(0)
        pool.release(1)

    run(main)


def test_backfill_by_estimates_lets_hinted_work_onto_the_heads_gpu() -> None:
    """``GPUPool(backfill="estimates")``: the EASY of before issue 23, for a program that
    trusts its own estimates: a hint that ends by the head's shadow (10 s away) passes it;
    under the default the same request waits."""
    for backfill, passes in (("estimates", True), ("limits", False)):
        pool = GPUPool(1, backfill=backfill)

        async def main(pool: GPUPool = pool, passes: bool = passes) -> None:
            pool.acquire_nowait(0.6, expected_s=10.0)
            head = asyncio.create_task(pool.acquire(1.0))
            await until_queued(pool, 1)
            if passes:
                assert pool.acquire_nowait(0.1, expected_s=0.01) == 0
                pool.release(0, 0.1)
            else:
                with pytest.raises(WouldBlock):
                    pool.acquire_nowait(0.1, expected_s=0.01)
            pool.release(0, 0.6)
            assert await head == 0
            pool.release(0)

        run(main)


@pytest.mark.parametrize("backfill", ["", "Estimates", 1, None])
def test_a_bad_backfill_is_refused_by_name(backfill: object) -> None:
    if backfill is None:
        with pytest.raises(TypeError, match="give backend or backfill"):
            GPUPool(backend=GPUPool(1)._backend, backfill="limits")
        return
    with pytest.raises(
        ValueError, match=f"backfill must be one of limits, estimates; got {backfill!r}"
    ):
        GPUPool(1, backfill=backfill)  # type: ignore[arg-type]
