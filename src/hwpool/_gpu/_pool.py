"""GPUPool: asyncio and blocking fronts over the pure scheduler core, plus leases.

All state lives in the core and is touched only under one ``threading.Lock``. A waiter is told
of its grant after the lock is dropped: an asyncio waiter through its own loop (directly when the
granting thread runs that loop, else ``call_soon_threadsafe``), a blocking waiter through its
own ``threading.Event``. A waiter that gives up (cancellation, timeout, KeyboardInterrupt)
either withdraws its ticket or, if a grant raced ahead of it, hands the grant straight back.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from types import TracebackType

from .._backends._base import PoolSnapshot, WaiterSnapshot
from .._core._capacity import (
    UNITS_PER_GPU,
    check_count,
    check_timeout,
    fraction_to_units,
    units_to_fraction,
)
from .._core._scheduler import Demand, Grant, Scheduler
from .._errors import WouldBlock
from .._host._detect import detect_gpus

__all__ = ["GPULease", "GPUPool", "PoolSnapshot", "WaiterSnapshot", "current_gpus"]

_current: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar(
    "hwpool_current_gpus", default=()
)


def current_gpus() -> list[int]:
    """The GPUs of the innermost lease entered in this context (``[]`` outside any lease)."""
    return list(_current.get())


class _Waiter:
    """A parked request. Under the pool lock, ``grant`` is set when the core grants it, and
    ``returned`` when that grant went back to the pool undelivered (its event loop had closed).
    """

    __slots__ = ("event", "future", "grant", "loop", "returned", "since", "ticket")

    def __init__(self, ticket: int, since: float, loop: asyncio.AbstractEventLoop | None) -> None:
        self.ticket = ticket
        self.since = since
        self.loop = loop
        self.future: asyncio.Future[None] | None = None
        self.event: threading.Event | None = None
        if loop is None:
            self.event = threading.Event()
        else:
            self.future = loop.create_future()
        self.grant: Grant | None = None
        self.returned = False


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class GPUPool:
    """Fractional and whole-GPU leases for any number of asyncio tasks and threads.

    ``GPUPool(num_gpus)`` manages ``num_gpus`` logical GPUs; ``GPUPool()`` detects them with
    :func:`hwpool.detect_gpus` (one logical GPU when none is found, so GPU code runs anywhere).
    Requests are served by one FIFO queue with reservations, best fit and backfill (see the
    scheduler core); cancelling or timing out a waiter never leaks capacity.
    """

    def __init__(self, num_gpus: int | None = None) -> None:
        if num_gpus is None:
            num_gpus = max(1, detect_gpus().count)
        elif isinstance(num_gpus, bool) or not isinstance(num_gpus, int):
            raise TypeError(f"num_gpus must be an int or None, got {num_gpus!r}")
        elif num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
        self._core = Scheduler(num_gpus)
        self._lock = threading.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._granted = self._released = self._cancelled = self._timed_out = 0

    def __repr__(self) -> str:
        return f"GPUPool(num_gpus={self.num_gpus})"

    @property
    def num_gpus(self) -> int:
        """The number of logical GPUs this pool shares out."""
        return self._core.num_gpus

    # ----------------------------------------------------------------- demands
    def _whole_demand(self, count: int) -> Demand:
        return Demand(check_count(count, self.num_gpus), UNITS_PER_GPU)

    def _submit(self, demand: Demand, loop: asyncio.AbstractEventLoop | None) -> Grant | _Waiter:
        """Under the lock: grant ``demand`` now, or park a waiter for it (asyncio if ``loop``)."""
        with self._lock:
            ticket, grant = self._core.submit(demand)
            if grant is not None:
                self._granted += 1
                return grant
            waiter = _Waiter(ticket, time.monotonic(), loop)
            self._waiters[ticket] = waiter
            return waiter

    # ----------------------------------------------------------------- async
    async def acquire(self, fraction: float = 1.0, *, timeout: float | None = None) -> int:
        """Wait for ``fraction`` (0 < fraction <= 1) of one GPU; return the GPU's index.

        Raises TimeoutError after ``timeout`` seconds; release with ``release(gpu, fraction)``.
        """
        demand = _fraction_demand(fraction)
        if timeout is not None:
            timeout = check_timeout(timeout)
        got = self._submit(demand, asyncio.get_running_loop())
        if isinstance(got, _Waiter):
            got = await self._wait_async(got, timeout)
        return got.gpus[0]

    async def acquire_full(self, count: int, *, timeout: float | None = None) -> list[int]:
        """Wait for ``count`` completely free GPUs, granted together; return their indices."""
        demand = self._whole_demand(count)
        return list((await self._acquire_async(demand, check_timeout(timeout))).gpus)

    async def _acquire_async(self, demand: Demand, timeout: float | None) -> Grant:
        got = self._submit(demand, asyncio.get_running_loop())
        return got if isinstance(got, Grant) else await self._wait_async(got, timeout)

    async def _wait_async(self, waiter: _Waiter, timeout: float | None) -> Grant:
        assert waiter.future is not None
        try:
            if timeout is None:
                await waiter.future
            else:
                async with asyncio.timeout(timeout):
                    await waiter.future
        except BaseException as exc:
            self._abandon(waiter, timed_out=isinstance(exc, TimeoutError))
            raise
        assert waiter.grant is not None
        return waiter.grant

    # ----------------------------------------------------------------- blocking
    def acquire_blocking(self, fraction: float = 1.0, *, timeout: float | None = None) -> int:
        """Like :meth:`acquire`, for threads: block until granted or ``timeout`` passes."""
        demand = _fraction_demand(fraction)
        return self._acquire_blocking(demand, check_timeout(timeout)).gpus[0]

    def acquire_full_blocking(self, count: int, *, timeout: float | None = None) -> list[int]:
        """Like :meth:`acquire_full`, for threads."""
        demand = self._whole_demand(count)
        return list(self._acquire_blocking(demand, check_timeout(timeout)).gpus)

    def _acquire_blocking(self, demand: Demand, timeout: float | None) -> Grant:
        waiter = self._submit(demand, None)
        if isinstance(waiter, Grant):
            return waiter
        assert waiter.event is not None
        try:
            woken = waiter.event.wait(timeout)
        except BaseException:
            self._abandon(waiter, timed_out=False)
            raise
        if not woken:
            with self._lock:
                withdrawn = waiter.grant is None  # else a grant won the race: keep it
                if withdrawn:
                    del self._waiters[waiter.ticket]
                    self._timed_out += 1
                    others = self._collect(self._core.cancel(waiter.ticket))
            if withdrawn:
                self._wake(others)
                raise TimeoutError(f"no GPU capacity granted within timeout={timeout}s")
        assert waiter.grant is not None
        return waiter.grant

    # ----------------------------------------------------------------- nowait
    def acquire_nowait(self, fraction: float = 1.0) -> int:
        """Take ``fraction`` of a GPU now, or raise :class:`hwpool.WouldBlock`.

        Never jumps the queue: granted only on GPUs no waiter reserves.
        """
        return self._acquire_nowait(_fraction_demand(fraction)).gpus[0]

    def acquire_full_nowait(self, count: int) -> list[int]:
        """Take ``count`` whole GPUs now, or raise :class:`hwpool.WouldBlock`."""
        return list(self._acquire_nowait(self._whole_demand(count)).gpus)

    def _acquire_nowait(self, demand: Demand) -> Grant:
        with self._lock:
            grant = self._core.grant_now(demand)
            if grant is None:
                raise WouldBlock(f"no GPU can take {_describe(demand)} without waiting")
            self._granted += 1
            return grant

    # ----------------------------------------------------------------- release
    def release(self, gpu_id: int, fraction: float = 1.0) -> None:
        """Give back ``fraction`` of GPU ``gpu_id`` (for whole GPUs: 1.0 on each of them).

        Raises ValueError, changing nothing, for an unknown GPU or more than is held on it.
        """
        units = _fraction_demand(fraction).units
        with self._lock:
            grants = self._core.release(gpu_id, units)
            self._released += 1
            woken = self._collect(grants) if grants else None
        if woken:
            self._wake(woken)

    def _release_grant(self, grant: Grant) -> None:
        """Give back ``grant.units`` on each of ``grant.gpus`` (all or nothing)."""
        with self._lock:
            if len(grant.gpus) == 1:
                grants = self._core.release(grant.gpus[0], grant.units)
            else:
                grants = self._core.release_many([(g, grant.units) for g in grant.gpus])
            self._released += len(grant.gpus)
            woken = self._collect(grants) if grants else None
        if woken:
            self._wake(woken)

    # ----------------------------------------------------------------- leases
    def lease(self, fraction: float = 1.0, *, timeout: float | None = None) -> GPULease:
        """A lease of ``fraction`` of one GPU, for ``async with`` or a plain ``with``."""
        return GPULease(self, _fraction_demand(fraction), check_timeout(timeout))

    def lease_full(self, count: int, *, timeout: float | None = None) -> GPULease:
        """A lease of ``count`` whole GPUs, for ``async with`` or a plain ``with``."""
        return GPULease(self, self._whole_demand(count), check_timeout(timeout))

    # ----------------------------------------------------------------- introspection
    def snapshot(self) -> PoolSnapshot:
        """Free capacity per GPU, the waiting queue and the counters, taken atomically."""
        now = time.monotonic()
        with self._lock:
            waiting = tuple(
                WaiterSnapshot(
                    w.demand.count,
                    units_to_fraction(w.demand.units),
                    w.reserved,
                    now - self._waiters[w.ticket].since,
                )
                for w in self._core.waiters()
            )
            return PoolSnapshot(
                num_gpus=self.num_gpus,
                free=tuple(units_to_fraction(u) for u in self._core.free),
                waiting=waiting,
                granted=self._granted,
                released=self._released,
                cancelled=self._cancelled,
                timed_out=self._timed_out,
            )

    # ----------------------------------------------------------------- waking
    def _collect(self, grants: list[Grant]) -> list[_Waiter]:
        """Under the lock: hand each grant to its waiter, to be woken by ``_wake``."""
        woken = []
        for grant in grants:
            waiter = self._waiters.pop(grant.ticket)
            waiter.grant = grant
            woken.append(waiter)
        self._granted += len(grants)
        return woken

    def _wake(self, waiters: list[_Waiter]) -> None:
        """Outside the lock: wake ``waiters``; give back grants whose loop has closed."""
        if not waiters:
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        undeliverable: list[_Waiter] = []
        for waiter in waiters:
            if waiter.event is not None:
                waiter.event.set()
                continue
            assert waiter.future is not None and waiter.loop is not None
            if waiter.loop is running:
                _resolve(waiter.future)
                continue
            try:
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future)
            except RuntimeError:  # its loop is closed: nobody will ever take this grant
                undeliverable.append(waiter)
        for waiter in undeliverable:
            self._abandon(waiter, timed_out=False, counted=False)

    def _abandon(self, waiter: _Waiter, *, timed_out: bool, counted: bool = True) -> None:
        """A waiter gave up: withdraw its ticket, or give back the grant that raced ahead.

        Safe to call twice for one waiter (a grant is given back once, whoever notices first).
        """
        grants: list[Grant] = []
        with self._lock:
            if waiter.grant is None:
                grants = self._core.cancel(waiter.ticket)
                del self._waiters[waiter.ticket]
            elif not waiter.returned:
                waiter.returned = True
                grant = waiter.grant
                grants = self._core.release_many([(g, grant.units) for g in grant.gpus])
            if counted and timed_out:
                self._timed_out += 1
            elif counted:
                self._cancelled += 1
            woken = self._collect(grants)
        self._wake(woken)


_DEMANDS: dict[float, Demand] = {}  # validated float fractions, the common case, memoised


def _fraction_demand(fraction: float) -> Demand:
    """The single-GPU demand for ``fraction``, validated (see ``fraction_to_units``)."""
    if type(fraction) is float:
        demand = _DEMANDS.get(fraction)
        if demand is None:
            demand = Demand(1, fraction_to_units(fraction))
            if len(_DEMANDS) < 4096:
                _DEMANDS[fraction] = demand
        return demand
    return Demand(1, fraction_to_units(fraction))


def _describe(demand: Demand) -> str:
    if demand.count > 1:
        return f"{demand.count} whole GPUs"
    return f"fraction={units_to_fraction(demand.units)}"


class GPULease:
    """Holds GPUs from a :class:`GPUPool` for the body of an ``async with`` or ``with`` block.

    ``.gpus`` lists the GPUs held (empty until entered), ``.fraction`` the share of each.
    Inside the block :func:`hwpool.current_gpus` returns ``.gpus``. A lease is entered once and
    releases exactly what it holds, once, when the block ends (also on error or cancellation).
    """

    __slots__ = ("_demand", "_grant", "_pool", "_timeout", "_token", "_used")

    def __init__(self, pool: GPUPool, demand: Demand, timeout: float | None) -> None:
        self._pool = pool
        self._demand = demand
        self._timeout = timeout
        self._grant: Grant | None = None
        self._token: contextvars.Token[tuple[int, ...]] | None = None
        self._used = False

    def __repr__(self) -> str:
        return f"GPULease(gpus={self.gpus}, fraction={self.fraction})"

    @property
    def gpus(self) -> list[int]:
        """The GPUs held (empty before the lease is entered and after it is released)."""
        return [] if self._grant is None else list(self._grant.gpus)

    @property
    def fraction(self) -> float:
        """The share of each leased GPU (1.0 for whole GPUs)."""
        return units_to_fraction(self._demand.units)

    def _start(self) -> None:
        if self._used:
            raise RuntimeError("a GPULease can be entered only once; ask the pool for a new one")
        self._used = True

    def _enter(self, grant: Grant) -> list[int]:
        self._grant = grant
        self._token = _current.set(grant.gpus)
        return list(grant.gpus)

    def _exit(self) -> None:
        grant, self._grant = self._grant, None
        if self._token is not None:
            token, self._token = self._token, None
            # Exited in another context than it was entered in: nothing there to restore.
            with contextlib.suppress(ValueError):
                _current.reset(token)
        if grant is not None:
            self._pool._release_grant(grant)

    async def __aenter__(self) -> list[int]:
        self._start()
        return self._enter(await self._pool._acquire_async(self._demand, self._timeout))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()

    def __enter__(self) -> list[int]:
        self._start()
        return self._enter(self._pool._acquire_blocking(self._demand, self._timeout))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()
