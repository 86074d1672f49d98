"""The in-process backend: the scheduler core, its parked waiters and one lock.

How the lock is used, and why (finalizers and Ctrl-C can run our code at awkward moments):

- State is touched only in a *section*: ``with self._lock:`` (which Ctrl-C cannot split from
  the acquire), then ``self._owner = get_ident()``, then ``_drain()`` of what was handed in.
  Granted waiters go to ``self._wake`` and are woken after the lock is dropped, by
  ``_settle()``, which every section is followed by; whatever an exception leaves there is
  woken by the next one.
- What may run inside a finalizer (a lease released by a task the GC collects, a task the GC
  abandons, a delivery that ``loop.close()`` drops) never waits for its own thread: it appends
  to ``self._returns`` and settles, which leaves the work to the enclosing section when this
  very thread holds the lock; every section drains ``_returns`` before it ends.
- A release with nobody waiting is only appended to ``_returns``: the next section applies it
  first, so no caller can see the difference, and an uncontended acquire+release pair takes
  the lock once.
- Grants that cannot be delivered are handed back in a loop, never by recursion, and every
  other request parked on the same closed loop is withdrawn with them.
- A section that queues a request marks the backend dirty until it is done; if an exception
  (KeyboardInterrupt) cuts it short, the next section reconciles the core with the waiters.
"""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from threading import get_ident
from typing import NamedTuple

from .._core._capacity import units_to_fraction
from .._core._scheduler import Demand, Grant, Scheduler
from .._core._scheduler import Waiter as CoreWaiter
from .._errors import PoolClosedError
from .._host._detect import GPUInfo
from ._base import PoolSnapshot, WaiterSnapshot
from ._waiters import AsyncWaiter, ThreadWaiter, Waiter

__all__ = ["LocalBackend"]


class _Reason(enum.Enum):
    CANCELLED = "cancelled"  # cancelled, interrupted or collected while waiting
    TIMED_OUT = "timed out"
    LOST = "lost"  # granted, but its event loop is closed: nobody will take the grant


class _GaveUp(NamedTuple):
    waiter: Waiter
    reason: _Reason


_Returned = tuple[Grant, float]
"""A grant handed back without the lock, and when (for the core to learn its hold time)."""


class LocalBackend:
    """Grants GPU capacity to asyncio tasks and threads of this process (see the module doc).

    ``gpus`` lists the logical GPUs, in index order; ``totals``, for a pool sized in memory,
    each one's capacity (MiB). The demands it receives are validated by the front
    (``hwpool.GPUPool``). ``policy``: the core's (``hwpool._core._scheduler.POLICIES``);
    ``clock``: seconds for the core (a test may freeze it to make ``easy`` deterministic).
    """

    remote = False  # acquire_now is a call under a lock: the front tries it before waiting

    def __init__(
        self,
        gpus: Sequence[GPUInfo],
        totals: Sequence[int] | None = None,
        *,
        policy: str = "easy",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gpus = tuple(gpus)
        self._clock = clock  # the core's time, from which it learns hold times
        self._sized = totals is not None
        sizes: int | tuple[int, ...] = len(self._gpus) if totals is None else tuple(totals)
        self._core = Scheduler(sizes, policy=policy)
        self._totals = (
            (self._core.units_per_gpu,) * len(self._gpus) if totals is None else tuple(totals)
        )
        self._lock = threading.Lock()
        self._owner = 0  # the thread that last entered a section (meaningful while locked)
        self._waiters: dict[int, Waiter] = {}  # ticket -> the request parked on it
        self._live: dict[int, Grant] = {}  # ticket -> what that grant still holds
        self._returns: deque[_Returned | _GaveUp] = deque()  # handed in, applied by _drain
        self._wake: deque[Waiter] = deque()  # granted (or closed), to be woken by _settle
        self._dirty = False
        self._closed = False
        self._on_lost = self._lost  # one bound method for every AsyncWaiter
        # Grants made are not counted: every one is live or released (see snapshot).
        self._released = self._cancelled = self._timed_out = 0

    def __repr__(self) -> str:
        return f"LocalBackend(num_gpus={len(self._gpus)})"

    @property
    def gpus(self) -> tuple[GPUInfo, ...]:
        """One entry per logical GPU, in index order."""
        return self._gpus

    @property
    def gpu_memory(self) -> tuple[int, ...] | None:
        """Each GPU's capacity in MiB on a pool sized in memory, else None."""
        return self._totals if self._sized else None

    # ----------------------------------------------------------------- acquiring
    def acquire_now(self, demand: Demand, expected: float | None = None) -> Grant | None:
        """Grant at once where that jumps no waiter, else None; ``expected``: the caller's
        guess of the hold time in seconds, or None to let the core learn it."""
        with self._lock:
            self._owner = get_ident()
            if self._closed:
                raise PoolClosedError("the GPU pool is closed")
            if self._returns or self._dirty:
                self._drain()
            grant = self._core.grant_now(demand, now=self._clock(), expected=expected)
            if grant is not None:
                self._live[grant.ticket] = grant
        if self._wake or self._returns:
            self._settle()
        return grant

    async def acquire(
        self, demand: Demand, timeout: float | None, expected: float | None = None
    ) -> Grant:
        """Wait on the running loop; TimeoutError after ``timeout`` seconds."""
        waiter = AsyncWaiter(asyncio.get_running_loop(), time.monotonic(), self._on_lost)
        try:
            grant = self._enqueue(demand, waiter, expected)
            if grant is None:
                if timeout is None:
                    await waiter.future
                else:
                    async with asyncio.timeout(timeout):
                        await waiter.future
                grant = waiter.grant
                if grant is None:
                    raise PoolClosedError("the GPU pool was closed while this request waited")
            return grant
        except BaseException as exc:
            reason = _Reason.TIMED_OUT if isinstance(exc, TimeoutError) else _Reason.CANCELLED
            self._abandon(waiter, reason)
            raise

    def acquire_blocking(
        self, demand: Demand, timeout: float | None, expected: float | None = None
    ) -> Grant:
        """Block this thread until granted; TimeoutError after ``timeout`` seconds."""
        waiter = ThreadWaiter(time.monotonic())
        try:
            grant = self._enqueue(demand, waiter, expected)
            if grant is None:
                woken = waiter.event.wait(timeout)
                grant = _granted_to(waiter) if woken else self._withdraw(waiter, timeout)
            return grant
        except BaseException:
            self._abandon(waiter, _Reason.CANCELLED)
            raise

    def _enqueue(
        self, demand: Demand, waiter: Waiter, expected: float | None = None
    ) -> Grant | None:
        """Grant ``demand`` at once (also recorded on ``waiter``), or park ``waiter`` for it."""
        with self._lock:
            self._owner = get_ident()
            if self._closed:
                raise PoolClosedError("the GPU pool is closed")
            if self._returns or self._dirty:
                self._drain()
            self._dirty = True  # until the core and self._waiters agree again
            ticket, grant = self._core.submit(demand, now=self._clock(), expected=expected)
            if grant is None:
                waiter.ticket = ticket
                self._waiters[ticket] = waiter
            else:  # the waiter holds it, so that an exception from here on gives it back
                waiter.grant = grant
                self._live[ticket] = grant
            self._dirty = False
        if self._wake or self._returns:
            self._settle()
        return grant

    def _withdraw(self, waiter: ThreadWaiter, timeout: float | None) -> Grant:
        """A blocking wait timed out: withdraw it and raise, unless a grant won the race."""
        with self._lock:
            self._owner = get_ident()
            if self._returns or self._dirty:
                self._drain()
            withdrawn = waiter.grant is None and self._waiters.pop(waiter.ticket, None) is not None
            if withdrawn:
                self._timed_out += 1
                self._collect(self._core.cancel(waiter.ticket, now=self._clock()))
        self._settle()
        if withdrawn:
            raise TimeoutError(f"no GPU capacity granted within timeout={timeout}s")
        return _granted_to(waiter)

    # ----------------------------------------------------------------- giving back
    def release(self, grant: Grant) -> None:
        """Give back ``grant``, or a part of it (same ticket and units, some of its GPUs).

        Raises ValueError, changing nothing, for a grant that is not held (released already,
        or not granted here). Never waits for a section of its own thread (see module doc).
        """
        held = self._live.pop(grant.ticket, None)
        if held is grant or held == grant:
            if not self._waiters or (self._owner == get_ident() and self._lock.locked()):
                # Applied by the next section (or the enclosing one), dated now.
                self._returns.append((held, self._clock()))
                return
            with self._lock:  # someone may be waiting for exactly this: apply it now
                self._owner = get_ident()
                if self._returns or self._dirty:
                    self._drain()
                self._released += 1
                grants = self._release_in_core(held, self._clock())
                if grants:
                    self._collect(grants)
            if self._wake or self._returns:
                self._settle()
            return
        if held is None:
            raise ValueError(
                f"grant {grant.ticket} ({_describe(grant)}) is not held: "
                "it was released already, or was not granted by this pool"
            )
        self._live[held.ticket] = held  # a part: decided under the lock
        self._release_part(grant)

    def _release_part(self, part: Grant) -> None:
        with self._lock:
            self._owner = get_ident()
            held = self._live.get(part.ticket)
            rest = () if held is None else tuple(g for g in held.gpus if g not in part.gpus)
            each = {} if held is None else dict(self._core.held(held))
            if (
                held is None
                or any(part.units not in (held.units, each.get(g)) for g in part.gpus)
                or len(set(part.gpus)) != len(part.gpus)
                or len(rest) + len(part.gpus) != len(held.gpus)
            ):
                raise ValueError(f"{_describe(part)} is not held under grant {part.ticket}")
            if self._returns or self._dirty:
                self._drain()
            if rest:  # a whole-GPU grant of mixed sizes keeps units 0 (see Scheduler.held)
                self._live[part.ticket] = Grant(part.ticket, rest, held.units)
            else:
                del self._live[part.ticket]
                self._released += 1
            parts = [(g, each[g]) for g in part.gpus]
            now = self._clock()
            self._collect(self._core.release_many(parts, ticket=part.ticket, now=now))
        self._settle()

    def _abandon(self, waiter: Waiter, reason: _Reason) -> None:
        """The waiting side gave up (may run in a finalizer: the GC closing its coroutine)."""
        self._returns.append(_GaveUp(waiter, reason))
        self._settle()

    def _lost(self, waiter: AsyncWaiter) -> None:
        """A delivery was dropped unrun by a closed loop (runs in that callback's finalizer)."""
        self._returns.append(_GaveUp(waiter, _Reason.LOST))
        self._settle()

    def _settle(self) -> None:
        """Wake the granted waiters and apply what was handed in, until there is neither.

        Never waits for this thread's own section: if this thread holds the lock (a finalizer
        run by an allocation inside a section), that section settles before it ends.
        """
        wake, returns = self._wake, self._returns
        while wake or returns:
            while wake:
                try:
                    waiter = wake.popleft()
                except IndexError:  # another thread woke it
                    break
                if not waiter.deliver():
                    returns.append(_GaveUp(waiter, _Reason.LOST))
            if returns:
                if self._owner == get_ident() and self._lock.locked():
                    return
                with self._lock:
                    self._owner = get_ident()
                    self._drain()

    # ----------------------------------------------------------------- under the lock
    def _drain(self) -> None:
        """Apply what was handed in without the lock (and repair after an exception)."""
        if self._dirty:
            self._reconcile()
        returns, core = self._returns, self._core
        while returns:
            item = returns.popleft()
            if isinstance(item, _GaveUp):
                grants = self._give_up(*item)
            else:
                self._released += 1
                grant, at = item
                if len(grant.gpus) == 1 and grant.units:
                    grants = core.release(grant.gpus[0], grant.units, ticket=grant.ticket, now=at)
                else:
                    grants = self._release_in_core(grant, at)
            if grants:
                self._collect(grants)

    def _release_in_core(self, grant: Grant, now: float | None = None) -> list[Grant]:
        ticket, core = grant.ticket, self._core
        if len(grant.gpus) == 1 and grant.units:
            return core.release(grant.gpus[0], grant.units, ticket=ticket, now=now)
        # held(): whole GPUs of mixed sizes have units 0
        return core.release_many(core.held(grant), ticket=ticket, now=now)

    def _collect(self, grants: list[Grant]) -> None:
        """Hand each grant to its waiter, to be woken by ``_settle``; a grant whose waiter is
        gone goes straight back, in this loop, not by recursion."""
        i = 0
        while i < len(grants):
            grant = grants[i]
            i += 1
            waiter = self._waiters.pop(grant.ticket, None)
            if waiter is None:
                grants += self._release_in_core(grant)
                continue
            waiter.grant = grant
            self._live[grant.ticket] = grant
            self._wake.append(waiter)

    def _give_up(self, waiter: Waiter, reason: _Reason) -> list[Grant]:
        """Withdraw ``waiter``'s request, or give back the grant that reached it too late."""
        grant = waiter.grant
        if grant is None:
            if self._waiters.pop(waiter.ticket, None) is None:
                return []  # never queued, or already withdrawn or closed
            self._count(reason)
            return self._core.cancel(waiter.ticket, now=self._clock())
        if waiter.returned or self._live.pop(grant.ticket, None) is None:
            return []  # given back already
        waiter.returned = True
        self._count(reason)
        self._released += 1
        grants = self._release_in_core(grant, self._clock())
        if reason is _Reason.LOST and isinstance(waiter, AsyncWaiter):
            grants += self._purge(waiter.loop)
        return grants

    def _count(self, reason: _Reason) -> None:
        if reason is _Reason.CANCELLED:
            self._cancelled += 1
        elif reason is _Reason.TIMED_OUT:
            self._timed_out += 1

    def _purge(self, loop: asyncio.AbstractEventLoop) -> list[Grant]:
        """Withdraw every request parked on ``loop``, which is closed: none could be told."""
        dead = [w for w in self._waiters.values() if isinstance(w, AsyncWaiter) and w.loop is loop]
        for waiter in dead:
            del self._waiters[waiter.ticket]
        grants: list[Grant] = []
        for waiter in dead:
            self._cancelled += 1
            if self._core.is_waiting(waiter.ticket):  # an earlier cancel may have granted it
                grants += self._core.cancel(waiter.ticket)
        return grants

    def _reconcile(self) -> None:
        """Repair what an exception inside ``_enqueue`` left: a queued ticket with no waiter,
        or capacity taken in the core that no grant holds."""
        for entry in list(self._core.waiters()):
            if entry.ticket not in self._waiters and self._core.is_waiting(entry.ticket):
                self._cancelled += 1
                self._collect(self._core.cancel(entry.ticket))
        held = [0] * len(self._gpus)
        returned = (item[0] for item in self._returns if not isinstance(item, _GaveUp))
        for grant in [*self._live.values(), *returned]:
            for gpu, units in self._core.held(grant):
                held[gpu] += units
        totals = self._totals  # free + held == total
        for gpu, free in enumerate(self._core.free):
            orphaned = totals[gpu] - free - held[gpu]
            if orphaned > 0:
                self._collect(self._core.release(gpu, orphaned))
        self._dirty = False

    # ----------------------------------------------------------------- introspection
    def snapshot(self) -> PoolSnapshot:
        """Free capacity per GPU, the queue in order and the counters, taken atomically."""
        now = time.monotonic()
        with self._lock:
            self._owner = get_ident()
            if self._returns or self._dirty:
                self._drain()
            waiting = []
            for entry in self._core.waiters():
                parked = self._waiters.get(entry.ticket)
                waiting.append(self._waiter_snapshot(entry, parked, now))
            totals = self._totals
            snap = PoolSnapshot(
                num_gpus=len(self._gpus),
                free=tuple(
                    f / t if self._sized else units_to_fraction(f)
                    for f, t in zip(self._core.free, totals, strict=True)
                ),
                waiting=tuple(waiting),
                granted=self._released + len(self._live),
                released=self._released,
                cancelled=self._cancelled,
                timed_out=self._timed_out,
                free_mib=self._core.free if self._sized else None,
                total_mib=totals if self._sized else None,
            )
        if self._wake or self._returns:
            self._settle()
        return snap

    def _waiter_snapshot(
        self, entry: CoreWaiter, parked: Waiter | None, now: float
    ) -> WaiterSnapshot:
        demand, waited = entry.demand, 0.0 if parked is None else now - parked.since
        if not self._sized:
            return WaiterSnapshot(
                demand.count, units_to_fraction(demand.units), entry.reserved, waited
            )
        if demand.count > 1 or demand.whole:
            return WaiterSnapshot(demand.count, 1.0, entry.reserved, waited)
        if demand.relative:  # a share of whichever GPU: no one amount of MiB
            return WaiterSnapshot(1, units_to_fraction(demand.units), entry.reserved, waited)
        share = demand.units / max(self._totals)
        return WaiterSnapshot(1, share, entry.reserved, waited, demand.units)

    def close(self) -> None:
        """Refuse new requests (PoolClosedError) and wake every waiter with PoolClosedError.

        Grants still held may be released afterwards (that is a no-op in effect). Idempotent.
        """
        with self._lock:
            self._owner = get_ident()
            if self._returns or self._dirty:
                self._drain()
            self._closed = True
            for waiter in self._waiters.values():
                waiter.closed = True
                self._wake.append(waiter)
            self._waiters.clear()
        self._settle()


def _granted_to(waiter: Waiter) -> Grant:
    """The grant a woken waiter received; PoolClosedError if it was woken by ``close()``."""
    if waiter.grant is None:
        raise PoolClosedError("the GPU pool was closed while this request waited")
    return waiter.grant


def _describe(grant: Grant) -> str:
    if not grant.units:
        return f"whole GPU(s) {list(grant.gpus)}"
    fraction = units_to_fraction(grant.units)
    return f"{fraction} of GPU(s) {list(grant.gpus)}"
