"""GPUPool after a KeyboardInterrupt at any line of the scheduling core (issue 22, item 7).

Before: Ctrl-C inside the core (between two statements of its submit path, say) left it
inconsistent: later releases raised "cannot release ... only ... held", capacity showed as
used with nothing holding it, and Ctrl-C itself came out as KeyError.

Here the main thread runs a fixed round of blocking calls on GPUPool(4) (grants at once,
whole GPUs, a request that waits and times out, releases with a waiter in another thread, a
partial release of whole GPUs) while KeyboardInterrupt is raised at the n-th line that runs in
``hwpool/_core``, for n = 1, 2, ... until the round runs through. After each, the caller does
what a caller can: it retries a release that was cut short (done already: ValueError; not
done: it goes through) and releases what it holds. Then every GPU is free, nothing waits, the
other thread got its GPUs, and the pool's books are empty.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from types import FrameType

import pytest

from hwpool import GPUPool
from hwpool._backends._local import LocalBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand, Grant
from injection import LOCAL_BACKEND, Injection, every_line

WAIT_S = 10.0
SCHEDULER_FILES = ("_scheduler.py", "_durations.py")


def backend_of(pool: GPUPool) -> LocalBackend:
    backend = pool._backend
    assert isinstance(backend, LocalBackend)
    return backend


class Caller:
    """The main thread's grants, as it knows them."""

    def __init__(self, pool: GPUPool) -> None:
        self.pool = pool
        self.held: list[tuple[int, float]] = []
        self.releasing: tuple[int, float] | None = None  # a release that was cut short

    def take(self, fraction: float, expected_s: float | None = None) -> None:
        gpu = self.pool.acquire_blocking(fraction, expected_s=expected_s)
        self.held.append((gpu, fraction))

    def take_full(self, count: int) -> None:
        self.held += [(gpu, 1.0) for gpu in self.pool.acquire_full_blocking(count)]

    def wait_briefly(self, count: int) -> None:
        """A request that queues behind what is held and times out: a cancel in the core."""
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


class Waiter(threading.Thread):
    """Another thread waiting for every GPU: released work reaches it through the core."""

    def __init__(self, pool: GPUPool) -> None:
        super().__init__(name="waiting-for-all", daemon=True)
        self.pool = pool
        self.got: list[int] = []

    def run(self) -> None:
        self.got = self.pool.acquire_full_blocking(self.pool.num_gpus, timeout=WAIT_S)
        for gpu in self.got:
            self.pool.release(gpu)

    def start_queued(self) -> None:
        """Start, and return once the core has queued its request."""
        self.start()
        deadline = time.monotonic() + WAIT_S
        while not self.pool.snapshot().waiting:
            assert time.monotonic() < deadline, "the waiting thread never queued"
            time.sleep(0.001)


def check_settled(pool: GPUPool, waiter: Waiter) -> None:
    """Every GPU free, nothing waiting, the other thread served, the books empty."""
    if waiter.ident is not None:
        waiter.join(WAIT_S)
        assert not waiter.is_alive() and waiter.got == [0, 1, 2, 3], "the waiter never got in"
    snap = pool.snapshot()
    assert snap.free == (1.0,) * 4 and snap.waiting == ()
    assert snap.granted == snap.released
    backend = backend_of(pool)
    assert not backend._live and not backend._waiters and not backend._returns


def one_round(injection: Injection) -> None:
    pool = GPUPool(4)
    caller, waiter = Caller(pool), Waiter(pool)
    try:
        with injection.active():
            caller.take(0.5)
            caller.take_full(2)
            caller.take(0.25, expected_s=1.0)
            caller.wait_briefly(4)
        waiter.start_queued()
        with injection.active():
            while caller.held:
                caller.give()
    except KeyboardInterrupt:
        assert injection.fired
    caller.recover()
    check_settled(pool, waiter)


def test_keyboard_interrupt_at_every_line_of_the_core_under_gpupool() -> None:
    assert every_line(one_round) > 50


class BackendCaller:
    """The same round on the backend itself, whose release is all or nothing: a release cut
    short either went through (a retry raises ValueError) or did not (a retry does it)."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.held: list[Grant] = []
        self.releasing: Grant | None = None

    def take_now(self, units: int) -> None:
        grant = self.backend.acquire_now(Demand(1, units))
        assert grant is not None
        self.held.append(grant)

    def take(self, demand: Demand, expected: float | None = None) -> None:
        grant = self.backend.acquire_blocking(demand, None, expected)
        if len(grant.gpus) == 1:
            self.held.append(grant)
        else:  # given back one GPU at a time: a part, then the rest
            self.held += [grant._replace(gpus=(gpu,)) for gpu in grant.gpus]

    def give(self) -> None:
        self.releasing = self.held.pop(0)
        self.backend.release(self.releasing)
        self.releasing = None

    def recover(self) -> None:
        if self.releasing is not None:
            try:
                self.backend.release(self.releasing)
            except ValueError as exc:  # it had its full effect
                assert "not held" in str(exc)
            self.releasing = None
        while self.held:
            self.give()


def backend_round(injection: Injection) -> None:
    pool = GPUPool(4)
    caller, waiter = BackendCaller(backend_of(pool)), Waiter(pool)
    try:
        with injection.active():
            caller.take_now(UNITS_PER_GPU // 2)
            caller.take(Demand(2, UNITS_PER_GPU))
            caller.take(Demand(1, UNITS_PER_GPU // 4), expected=1.0)
            with pytest.raises(TimeoutError):
                caller.backend.acquire_blocking(Demand(4, UNITS_PER_GPU), 0.0)
        waiter.start_queued()
        with injection.active():
            while caller.held:
                caller.give()
    except KeyboardInterrupt:
        assert injection.fired
    caller.recover()
    check_settled(pool, waiter)


def test_keyboard_interrupt_at_every_line_of_the_local_backend_and_core() -> None:
    # The backend's own books too: the waiters, the grants handed out and handed in.
    assert every_line(backend_round, LOCAL_BACKEND) > 100


def test_a_bad_release_inside_the_threads_own_section_does_not_deadlock() -> None:
    # A finalizer may release (wrongly) while its thread is inside a section: the repair
    # after the error must leave the work to that section, not wait for its lock.
    pool = GPUPool(1)
    backend = backend_of(pool)
    backend._lock.acquire()
    try:
        backend._owner = threading.get_ident()
        backend._dirty = True  # as inside a section
        with pytest.raises(ValueError, match="not held"):
            backend.release(Grant(99, (0,), UNITS_PER_GPU))
        backend._dirty = False
    finally:
        backend._lock.release()
    assert pool.snapshot().free == (1.0,)


class AsyncCaller:
    """Tasks of one event loop waiting on futures: what they hold and are giving back."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.held: list[Grant] = []
        self.releasing: list[Grant] = []
        self.interrupted = False
        self.main: asyncio.Task[object] | None = None

    def give(self, grant: Grant) -> None:
        self.held.remove(grant)
        self.releasing.append(grant)
        self.backend.release(grant)
        self.releasing.remove(grant)

    async def hold(self, demand: Demand) -> None:
        try:
            grant = await self.backend.acquire(demand, None)
            self.held.append(grant)
            try:
                await asyncio.sleep(0)
            finally:
                self.give(grant)
        except KeyboardInterrupt:  # out of a task, asyncio would only log it: end the round
            self.interrupted = True
            assert self.main is not None
            self.main.cancel()

    async def round(self) -> None:
        """The round in the main task; an interrupt in any task ends it. What it leaves
        running (tasks waiting on futures) ``asyncio.run`` then cancels."""
        self.main = asyncio.current_task()
        try:
            await self._round()
        except KeyboardInterrupt:
            self.interrupted = True
        except asyncio.CancelledError:
            assert self.interrupted

    async def _round(self) -> None:
        first = self.backend.acquire_now(Demand(2, UNITS_PER_GPU))
        assert first is not None
        self.held.append(first)
        demands = (Demand(1, UNITS_PER_GPU // 2), Demand(2, UNITS_PER_GPU), Demand(1, 1000))
        tasks = [asyncio.create_task(self.hold(demand)) for demand in demands]
        await asyncio.sleep(0)  # every task queues behind `first`
        self.give(first)
        await asyncio.gather(*tasks)

    def recover(self) -> None:
        for grant in [*self.releasing, *self.held]:
            try:
                self.backend.release(grant)
            except ValueError as exc:  # it had its full effect
                assert "not held" in str(exc)


def async_round(injection: Injection) -> None:
    pool = GPUPool(2)
    caller = AsyncCaller(backend_of(pool))
    with injection.active():
        asyncio.run(caller.round())  # what it leaves running, it cancels
    assert caller.interrupted == injection.fired
    caller.recover()
    snap = pool.snapshot()
    assert snap.free == (1.0, 1.0) and snap.waiting == ()
    backend = backend_of(pool)
    assert not backend._live and not backend._waiters and not backend._returns


def test_keyboard_interrupt_at_every_line_with_tasks_waiting_on_futures() -> None:
    assert every_line(async_round, LOCAL_BACKEND) > 100


def test_keyboard_interrupt_storm_in_the_core_and_the_backend() -> None:
    # Real signals this time, where CPython runs handlers: SIGALRM every 50 us, whose handler
    # raises KeyboardInterrupt (once per round) when it lands in the core or the backend.
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs setitimer")
    armed, hits = [False], [0]

    def storm(signum: int, frame: FrameType | None) -> None:
        if armed[0] and frame is not None and frame.f_code.co_filename.startswith(LOCAL_BACKEND):
            armed[0] = False
            hits[0] += 1
            raise KeyboardInterrupt

    pool = GPUPool(2)
    caller = BackendCaller(backend_of(pool))
    previous = signal.signal(signal.SIGALRM, storm)
    signal.setitimer(signal.ITIMER_REAL, 5e-5, 5e-5)
    try:
        for _ in range(2000):
            armed[0] = True
            try:
                caller.take_now(UNITS_PER_GPU // 2)
                caller.take_now(UNITS_PER_GPU // 4)
                with pytest.raises(TimeoutError):  # queued behind them, then cancelled
                    caller.backend.acquire_blocking(Demand(2, UNITS_PER_GPU), 0.0)
                while caller.held:
                    caller.give()
            except KeyboardInterrupt:
                pass
            armed[0] = False
            caller.recover()
            snap = pool.snapshot()
            assert snap.free == (1.0, 1.0) and snap.waiting == ()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
    assert hits[0] > 0  # the storm did land in the core or the backend


def test_keyboard_interrupt_storm_under_gpupool_releases_what_it_forgot() -> None:
    # GPUPool.release takes a grant off its own books, then asks the backend: a release
    # that raises must therefore have had its full effect. Before, a Ctrl-C in the backend's
    # release (before it touched its books) gave nothing back, and the grant was lost.
    # Not here: one landing on the very entry of release, before any of its code ran: there
    # the front itself would have to put the grant back.
    if not hasattr(signal, "setitimer"):
        pytest.skip("needs setitimer")
    armed, hits = [False], [0]
    entry = LocalBackend.release.__code__
    # The backend and the scheduling core under it (GPUPool itself converts fractions with
    # other parts of the core, before it forgets the grant).
    under = (LOCAL_BACKEND[1], *(f"{LOCAL_BACKEND[0]}/{name}" for name in SCHEDULER_FILES))

    def storm(signum: int, frame: FrameType | None) -> None:
        if (
            armed[0]
            and frame is not None
            and frame.f_code.co_filename.startswith(under)
            and not (frame.f_code is entry and frame.f_lasti == 0)
        ):
            armed[0] = False
            hits[0] += 1
            raise KeyboardInterrupt

    pool = GPUPool(2)
    previous = signal.signal(signal.SIGALRM, storm)
    signal.setitimer(signal.ITIMER_REAL, 5e-5, 5e-5)
    try:
        for _ in range(2000):
            held = [(pool.acquire_nowait(0.5), 0.5), (pool.acquire_nowait(0.25), 0.25)]
            armed[0] = True
            try:
                while held:
                    pool.release(*held[-1])
                    held.pop()
            except KeyboardInterrupt:
                held.pop()  # GPUPool forgot it: the backend must have released it
            armed[0] = False
            for gpu, fraction in held:
                pool.release(gpu, fraction)
            assert pool.snapshot().free == (1.0, 1.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, previous)
    assert hits[0] > 0
