"""GPUPool's fronts after a KeyboardInterrupt at any signal point (issue 35).

``tests/gpu/test_gpu_interrupts.py`` interrupts the core and the backend at every *line*;
here the whole in-process call is interrupted, front included (``hwpool._gpu``,
``hwpool._backends``, ``hwpool._core``), at every *signal point*: every place inside a line
where CPython 3.11 runs a signal handler (a function's entry, after each call returns, a
loop's back edge, resuming after ``yield``; see ``tests/injection.py``). A line is usually
several of them: the grant that a call returns is lost if the interrupt lands before the
caller stores it.

A round is a fixed series of calls on a fresh pool, for point n = 1, 2, ... until the round
runs through. The caller knows what it can know: what a call returned, and that a release
or a lease's exit it made was cut short. After the interrupt it gives back what it holds (a
release cut short is retried: ValueError says it had its full effect). Then: every GPU is
free, nothing waits, the other thread got its GPUs, no book (the front's kept grants, the
backend's live grants, waiters and hand-ins) holds anything, and a fresh acquire and release
work. Before the fix a grant returned by the backend and lost on the way to the caller stayed
held, and so did a lease's grant when its exit was cut short.

By default every ``SAMPLE``-th point of each round is tried (with point 1 and the last);
``TESTS_HWPOOL_LONG=1`` tries them all.

The fix: the backend hands a grant over through a claim (a list it appends the grant to in
the same step as it books it), which the front's ``except BaseException`` gives back; a
backend's give-up is handed in before any signal point; a release retried where it was cut
short; and a lease's finalizer gives back a grant whose exit never ran (Ctrl-C at the very
entry of ``__exit__``). Seen failing before it: every round (a lost grant, or a lease's).

The asyncio round counts only the points in hwpool's own code (``foreign_entries=False``):
an interrupt at the entry of asyncio's ``call_soon``, run by ``Future.set_result``, loses a
task's wake-up inside asyncio itself; ``asyncio.run`` turns the first Ctrl-C into a
cancellation of its main task instead, and cancellation is covered here at every point.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Callable

import pytest

import hwpool
from hwpool import GPULease, GPUPool
from hwpool._backends._local import LocalBackend
from injection import PACKAGE, AtSignalPoints, Injection

WAIT_S = 10.0
SAMPLE = 1 if os.environ.get("TESTS_HWPOOL_LONG") else 7
FRONT = (str(PACKAGE / "_gpu"), str(PACKAGE / "_backends"), str(PACKAGE / "_core"))


def every_point(
    run: Callable[[Injection], None], limit: int = 20_000, *, foreign_entries: bool = True
) -> int:
    """Call ``run`` with an interrupt at signal point 1, then every ``SAMPLE``-th, until one
    runs through with none fired (then the last points are tried one by one); return how
    many points the round has. ``foreign_entries``: see :class:`AtSignalPoints`."""

    def at_point(n: int) -> AtSignalPoints:
        return AtSignalPoints(n, FRONT, foreign_entries=foreign_entries)

    at = 1
    while at < limit:
        injection = at_point(at)
        run(injection)
        if not injection.fired:
            break
        at += SAMPLE
    else:
        raise AssertionError(f"still injecting after {limit} signal points")
    for last in range(max(1, at - SAMPLE + 1), at):  # the tail the stride stepped over
        run(at_point(last))
    clean = at_point(at + 1)
    run(clean)
    assert not clean.fired
    return at - 1


def backend_of(pool: GPUPool) -> LocalBackend:
    backend = pool._backend
    assert isinstance(backend, LocalBackend)
    return backend


def check_settled(pool: GPUPool) -> None:
    """Every GPU free, nothing waiting, every book empty, and the pool still works."""
    snap = pool.snapshot()
    assert snap.free == (1.0,) * pool.num_gpus, "capacity held by nobody"
    assert snap.waiting == (), "a request left waiting"
    assert snap.granted == snap.released
    backend = backend_of(pool)
    assert not backend._live, f"grants held that no caller knows of: {backend._live}"
    assert not backend._waiters and not backend._returns and not backend._wake
    assert not any(pool._held), f"the front keeps grants nobody holds: {pool._held}"
    gpus = pool.acquire_full_blocking(pool.num_gpus, timeout=WAIT_S)
    for gpu in gpus:
        pool.release(gpu)
    assert pool.snapshot().free == (1.0,) * pool.num_gpus


class Waiter(threading.Thread):
    """Another thread waiting for every GPU: what the main thread releases reaches it."""

    def __init__(self, pool: GPUPool) -> None:
        super().__init__(name="waiting-for-all", daemon=True)
        self.pool = pool
        self.got: list[int] = []

    def run(self) -> None:
        self.got = self.pool.acquire_full_blocking(self.pool.num_gpus, timeout=WAIT_S)
        for gpu in self.got:
            self.pool.release(gpu)

    def start_queued(self) -> None:
        self.start()
        deadline = time.monotonic() + WAIT_S
        while not self.pool.snapshot().waiting:
            assert time.monotonic() < deadline, "the waiting thread never queued"
            time.sleep(0.001)

    def check(self) -> None:
        if self.ident is not None:
            self.join(WAIT_S)
            assert not self.is_alive() and self.got == list(range(self.pool.num_gpus))


class Caller:
    """The main thread's grants, as it knows them: what the calls returned."""

    def __init__(self, pool: GPUPool) -> None:
        self.pool = pool
        self.held: list[tuple[int, float]] = []
        self.releasing: tuple[int, float] | None = None  # a release that was cut short
        self.leases: list[GPULease] = []

    def take(self, fraction: float, expected_s: float | None = None) -> None:
        gpu = self.pool.acquire_blocking(fraction, expected_s=expected_s)
        self.held.append((gpu, fraction))

    def take_nowait(self, fraction: float) -> None:
        gpu = self.pool.acquire_nowait(fraction)
        self.held.append((gpu, fraction))

    def take_full(self, count: int) -> None:
        gpus = self.pool.acquire_full_blocking(count)
        self.held += [(gpu, 1.0) for gpu in gpus]

    def time_out(self, count: int) -> None:
        """A request that queues behind what is held and times out."""
        with pytest.raises(TimeoutError):
            self.pool.acquire_full_blocking(count, timeout=0.0)

    def give(self) -> None:
        self.releasing = self.held.pop(0)
        self.pool.release(*self.releasing)
        self.releasing = None

    def recover(self) -> None:
        """Retry a release that was cut short, then give back the rest."""
        if self.releasing is not None:
            try:
                self.pool.release(*self.releasing)
            except ValueError as exc:  # it had its full effect
                assert "no grant" in str(exc)
            self.releasing = None
        while self.held:
            self.give()


def thread_round(injection: Injection) -> None:
    pool = GPUPool(4)
    caller, waiter = Caller(pool), Waiter(pool)
    try:
        with injection.active():
            caller.take(0.5)
            caller.take_nowait(0.25)
            caller.take_full(2)
            caller.take(0.75, expected_s=1.0)  # no two alike: a retried release is clear
            caller.time_out(4)
        waiter.start_queued()
        with injection.active():
            while caller.held:
                caller.give()
    except KeyboardInterrupt:
        assert injection.fired
    caller.recover()
    waiter.check()
    check_settled(pool)


def test_keyboard_interrupt_at_every_signal_point_of_the_blocking_front() -> None:
    assert every_point(thread_round) > 200


def lease_round(injection: Injection) -> None:
    pool = GPUPool(2)
    try:
        with injection.active():
            with pool.lease(0.5) as gpus:
                assert hwpool.current_gpus() == gpus
                with (
                    pool.lease_full(1, expected_s=1.0),
                    pytest.raises(TimeoutError),
                    pool.lease_full(2, timeout=0.0),
                ):
                    pass
            with pool.lease(0.25):
                pass
    except KeyboardInterrupt:
        assert injection.fired
    assert hwpool.current_gpus() == []
    check_settled(pool)


def test_keyboard_interrupt_at_every_signal_point_of_a_lease() -> None:
    assert every_point(lease_round) > 100


class AsyncCaller:
    """Tasks on one loop, each taking and giving back through the front; what each holds."""

    def __init__(self, pool: GPUPool) -> None:
        self.pool = pool
        self.held: list[tuple[int, float]] = []
        self.releasing: list[tuple[int, float]] = []

    def give(self, grant: tuple[int, float]) -> None:
        self.held.remove(grant)
        self.releasing.append(grant)
        self.pool.release(*grant)
        self.releasing.remove(grant)

    async def hold(self, fraction: float, timeout: float | None = None) -> None:
        gpu = await self.pool.acquire(fraction, timeout=timeout)
        self.held.append((gpu, fraction))
        await asyncio.sleep(0)
        self.give((gpu, fraction))

    async def hold_full(self, count: int) -> None:
        gpus = await self.pool.acquire_full(count)
        self.held += [(gpu, 1.0) for gpu in gpus]
        await asyncio.sleep(0)
        for gpu in gpus:
            self.give((gpu, 1.0))

    async def lease(self, fraction: float) -> None:
        async with self.pool.lease(fraction):
            await asyncio.sleep(0)

    async def round(self) -> None:
        first = await self.pool.acquire_full(2)
        self.held += [(gpu, 1.0) for gpu in first]
        tasks = [
            asyncio.create_task(self.hold(0.5)),
            asyncio.create_task(self.hold_full(2)),
            asyncio.create_task(self.lease(0.25)),
            asyncio.create_task(self.hold(1.0, timeout=0.0)),  # times out in the queue
        ]
        doomed = asyncio.create_task(self.lease(1.0))
        await asyncio.sleep(0)  # every task queues behind `first`
        doomed.cancel()  # cancelled while it waits
        for gpu in first:
            self.give((gpu, 1.0))
        results = await asyncio.gather(*tasks, doomed, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(
                result, TimeoutError | asyncio.CancelledError
            ):
                raise result

    def recover(self) -> None:
        for grant in self.releasing:
            try:
                self.pool.release(*grant)
            except ValueError as exc:  # it had its full effect
                assert "no grant" in str(exc)
        for grant in self.held:
            self.pool.release(*grant)


def async_round(injection: Injection) -> None:
    pool = GPUPool(2)
    caller = AsyncCaller(pool)
    try:
        with injection.active():
            asyncio.run(caller.round())  # what it leaves running, it cancels
    except KeyboardInterrupt:
        assert injection.fired
    # A task that failed keeps its exception, and with it the frames of a lease whose exit
    # never ran, in reference cycles: the lease's finalizer runs once they are collected.
    gc.collect()
    caller.recover()
    check_settled(pool)


def test_keyboard_interrupt_at_every_signal_point_of_the_async_front() -> None:
    assert every_point(async_round, foreign_entries=False) > 200
