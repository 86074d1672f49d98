"""Races with event loops that close, the garbage collector and Ctrl-C.

Each test is named after the race it pins. None relies on a cyclic GC pass happening by
chance: where the collector is part of the race, the test disables it and runs it at the
exact point of the race.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
import threading
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any

import pytest

from hostserver import MakePool
from hwpool import GPUPool, WouldBlock
from hwpool._backends._local import LocalBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand, Scheduler

BOUND = 5.0


def backend_of(pool: GPUPool) -> LocalBackend:
    backend = pool._backend
    assert isinstance(backend, LocalBackend)
    return backend


def core_of(pool: GPUPool) -> Scheduler:
    return backend_of(pool)._core


async def until_queued(pool: GPUPool, n: int) -> None:
    for _ in range(1000):
        if len(pool.snapshot().waiting) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never saw {n} waiters")


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def run_in_thread(fn: Any) -> bool:
    """Run ``fn`` in a daemon thread; whether it finished within BOUND (False: it hung)."""
    done = threading.Event()

    def target() -> None:
        fn()
        done.set()

    threading.Thread(target=target, daemon=True).start()
    return done.wait(BOUND)


# ----------------------------------------------------------------- closed event loops
def test_grant_queued_to_a_stopped_loop_comes_back_when_the_loop_closes(
    make_pool: MakePool,
) -> None:
    # Before: loop.close() dropped the call_soon_threadsafe callback, and the capacity
    # belonged to nobody until a cyclic GC pass collected the dead task.
    pool = make_pool(1)
    pool.acquire_nowait(1.0)
    loop = asyncio.new_event_loop()
    task = loop.create_task(pool.acquire(0.5))
    loop.run_until_complete(until_queued(pool, 1))  # parked; the loop has stopped
    with collector_off():
        pool.release(0)  # from outside the loop: queued to it with call_soon_threadsafe
        assert pool.snapshot().free == (0.5,)
        loop.close()  # drops that callback unrun
        snap = pool.snapshot()
        assert snap.free == (1.0,) and snap.waiting == ()
        assert not task.done()  # still referenced: nothing was collected
        assert (snap.granted, snap.released) == (2, 2)


def test_release_survives_hundreds_of_waiters_on_a_closed_loop() -> None:
    # Before: each undeliverable grant was handed back recursively (_wake -> _abandon ->
    # _wake ...), and release() died with RecursionError after the core had granted.
    pool = GPUPool(1)
    pool.acquire_nowait(1.0)
    loop = asyncio.new_event_loop()
    tasks = [loop.create_task(pool.acquire(0.5)) for _ in range(600)]
    loop.run_until_complete(until_queued(pool, len(tasks)))
    loop.close()
    pool.release(0)
    snap = pool.snapshot()
    assert snap.free == (1.0,) and snap.waiting == ()
    assert pool.acquire_nowait(1.0) == 0  # the queue is not wedged
    assert len(tasks) == 600


def test_closed_loop_waiters_are_withdrawn_without_holding_back_other_loops() -> None:
    pool = GPUPool(1)
    pool.acquire_nowait(1.0)
    dead = asyncio.new_event_loop()
    tasks = [dead.create_task(pool.acquire(1.0)) for _ in range(50)]
    dead.run_until_complete(until_queued(pool, 50))
    dead.close()
    del tasks

    async def live() -> int:
        task = asyncio.create_task(pool.acquire(1.0, timeout=BOUND))
        await until_queued(pool, 51)
        pool.release(0)
        return await task

    assert asyncio.run(live()) == 0
    snap = pool.snapshot()
    # The first dead waiter was granted and its grant came back; the other 49 were withdrawn.
    assert snap.waiting == () and snap.cancelled == 49
    assert (snap.granted, snap.released) == (3, 2)


# ----------------------------------------------------------------- finalizers
def test_collecting_an_abandoned_waiter_inside_a_locked_section_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: the dead task's GeneratorExit ran the abandon path, which took the pool's
    # non-reentrant lock in the thread that already held it.
    pool = GPUPool(1)
    pool.acquire_nowait(1.0)
    with collector_off():
        loop = asyncio.new_event_loop()
        task = loop.create_task(pool.acquire(0.5))
        loop.run_until_complete(until_queued(pool, 1))
        pool.release(0)  # its grant is queued to the stopped loop...
        loop.close()  # ...and dropped: task, future and waiter are now garbage in a cycle
        del loop, task
        core = core_of(pool)
        grant_now = core.grant_now

        def grant_now_collecting(demand: Demand, **when: float | None) -> object:
            gc.collect()  # as an allocation inside the locked section may trigger it
            return grant_now(demand, **when)

        monkeypatch.setattr(core, "grant_now", grant_now_collecting)
        assert run_in_thread(lambda: pool.acquire_nowait(0.25))
    monkeypatch.undo()
    snap = pool.snapshot()
    assert snap.free == (0.75,) and snap.waiting == ()


def test_collecting_a_task_inside_a_lease_during_a_locked_section_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lease's exit runs in the collected coroutine's GeneratorExit: its release must not
    # take the lock its own thread holds (a waiter exists, so the release is applied at once).
    pool = GPUPool(1)
    gate = threading.Event()
    waiter_result: list[int] = []

    def blocked_waiter() -> None:
        waiter_result.append(pool.acquire_blocking(1.0, timeout=BOUND))
        gate.set()

    with collector_off():
        loop = asyncio.new_event_loop()

        async def holder() -> None:
            async with pool.lease(0.5):
                await asyncio.Event().wait()

        task = loop.create_task(holder())
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()  # the task is left suspended inside its lease
        del loop, task
        thread = threading.Thread(target=blocked_waiter, daemon=True)
        thread.start()
        while not pool.snapshot().waiting:
            gate.wait(0.001)
        core = core_of(pool)
        grant_now = core.grant_now

        def grant_now_collecting(demand: Demand, **when: float | None) -> object:
            gc.collect()
            return grant_now(demand, **when)

        monkeypatch.setattr(core, "grant_now", grant_now_collecting)

        def nowait() -> None:
            with contextlib.suppress(WouldBlock):  # the waiter reserves the GPU
                pool.acquire_nowait(0.25)

        assert run_in_thread(nowait)  # the lease is released meanwhile
    monkeypatch.undo()
    assert gate.wait(BOUND) and waiter_result == [0]  # the release reached the waiter
    thread.join(BOUND)


# ----------------------------------------------------------------- KeyboardInterrupt
def submit_codes() -> set[CodeType]:
    """The code of the queueing path: between the core queueing a ticket and its waiter."""
    return {LocalBackend.acquire_blocking.__code__, LocalBackend._enqueue.__code__}


def interrupt_at_line(n: int, codes: set[CodeType]) -> Any:
    """A tracer that raises KeyboardInterrupt at the n-th new line reached in ``codes``.

    A line event back at a ``with`` statement (its exit) is skipped: the tracer could raise
    there before ``__exit__`` runs, which no signal can (CPython checks for signals after the
    call to ``__exit__``, not before); the storm test covers where signals do land.
    """
    seen = 0
    last: dict[FrameType, int] = {}

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal seen
        if event == "line" and frame.f_lineno > last.get(frame, 0):
            last[frame] = frame.f_lineno
            seen += 1
            if seen == n:
                raise KeyboardInterrupt
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code in codes else None

    return tracer


def assert_consistent(pool: GPUPool, free: tuple[float, ...]) -> None:
    snap = pool.snapshot()
    assert snap.waiting == () and snap.free == free
    assert not backend_of(pool)._waiters


@pytest.mark.parametrize("queued", [True, False], ids=["queued", "granted-at-once"])
def test_keyboard_interrupt_at_every_line_of_submit_leaves_no_orphan(queued: bool) -> None:
    # Before: Ctrl-C after the core queued the ticket but before its waiter existed left an
    # orphan: the next release() raised KeyError and lost its capacity, snapshot() too.
    half = Demand(1, UNITS_PER_GPU // 2)
    for n in range(1, 200):
        pool = GPUPool(1)
        holder = pool.acquire_nowait(1.0 if queued else 0.5)
        backend = backend_of(pool)
        sys.settrace(interrupt_at_line(n, submit_codes()))
        try:
            grant = backend.acquire_blocking(half, 0.0)  # times out at once if queued
        except KeyboardInterrupt:
            interrupted = True
        except TimeoutError:
            interrupted = False
        else:
            interrupted = False
            backend.release(grant)
        finally:
            sys.settrace(None)
        assert_consistent(pool, (0.0,) if queued else (0.5,))
        pool.release(holder, 1.0 if queued else 0.5)  # from here on, as if another thread
        assert_consistent(pool, (1.0,))
        if not interrupted:
            assert n > 3  # every line was reached before this run
            return
    raise AssertionError("the call never ran to its end")


def test_keyboard_interrupt_storm_during_submit_leaves_no_orphan() -> None:
    # SIGALRM fires every 50 us; its handler raises KeyboardInterrupt when it lands in the
    # queueing path (once per call), wherever in it the interpreter checks for signals.
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs setitimer")
    codes = submit_codes()
    armed = [False]
    hits = [0]

    def storm(signum: int, frame: FrameType | None) -> None:
        if armed[0] and frame is not None and frame.f_code in codes:
            armed[0] = False
            hits[0] += 1
            raise KeyboardInterrupt

    pool = GPUPool(1)
    backend = backend_of(pool)
    half = Demand(1, UNITS_PER_GPU // 2)
    previous = signal.signal(signal.SIGALRM, storm)
    signal.setitimer(signal.ITIMER_REAL, 5e-5, 5e-5)
    try:
        for i in range(3000):
            queued = i % 2 == 0
            holder = pool.acquire_nowait(1.0 if queued else 0.5)
            armed[0] = True
            with contextlib.suppress(KeyboardInterrupt, TimeoutError):
                backend.release(backend.acquire_blocking(half, 0.0))
            armed[0] = False
            assert pool.snapshot().waiting == ()
            pool.release(holder, 1.0 if queued else 0.5)
            assert pool.snapshot().free == (1.0,)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
    assert_consistent(pool, (1.0,))
    assert hits[0] > 0  # the storm did land in the queueing path
