"""The in-process backend: the scheduler core, its parked waiters and one lock.

How the lock is used, and why (finalizers and Ctrl-C can run our code at awkward moments):

- State is touched only in a *section*: ``with self._lock:`` (which Ctrl-C cannot split from
  the acquire), then ``self._owner = get_ident()``, then ``_begin()``, which applies what was
  handed in.
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
- Exceptions: the core's calls are not atomic, and a signal handler (Ctrl-C's
  KeyboardInterrupt) may raise between any two of its lines, or of ours. So every section
  marks the backend dirty while it changes anything (from ``_begin`` to its end), and one
  that finds it dirty first rebuilds the core from what this backend knows (``_rebuild``):
  ``_live`` and the releases handed in are held, the parked waiters wait, in ticket order;
  nothing else survives. A call cut short has had its full effect, or none, as the caller
  sees it: a release or withdrawal counts from the moment its grant or waiter left our books,
  a grant only once it is on them (``acquire_now`` gives back one it could not return).
  Each change to our books is one step that no signal handler can split, or an order where a
  split leaves something the rebuild reads right (``_collect``, ``_drain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from threading import get_ident
from typing import NamedTuple

from .._core._capacity import units_to_fraction
from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._scheduler import Demand, Grant, Scheduler
from .._core._scheduler import Waiter as CoreWaiter
from .._errors import PoolClosedError
from .._host._detect import GPUInfo
from .._host._devices import memory_groups_of
from ._base import PoolSnapshot, WaiterSnapshot
from ._deadlines import Deadlines
from ._waiters import AsyncWaiter, ThreadWaiter, Waiter

__all__ = ["LocalBackend"]


class _Reason(enum.Enum):
    CANCELLED = "cancelled"  # cancelled, interrupted or collected while waiting
    TIMED_OUT = "timed out"
    LOST = "lost"  # granted, but its event loop is closed: nobody will take the grant


class _GaveUp(NamedTuple):
    waiter: Waiter
    reason: _Reason


# _GaveUp((waiter, reason)) without the Python frame of NamedTuple.__new__: a request that
# waits makes two, one for each way it may give up.
_gave_up = functools.partial(tuple.__new__, _GaveUp)
_CANCELLED, _TIMED_OUT = _Reason.CANCELLED, _Reason.TIMED_OUT

_Returned = tuple[Grant, float]
"""A grant handed back without the lock, and when (for the core to learn its hold time)."""


class LocalBackend:
    """Grants GPU capacity to asyncio tasks and threads of this process (see the module doc).

    ``gpus`` lists the logical GPUs, in index order; ``totals``, for a pool sized in memory,
    each one's capacity (MiB). The demands it receives are validated by the front
    (``hwpool.GPUPool``). ``policy``: the core's (``hwpool._core._scheduler.POLICIES``);
    ``clock``: seconds for the core (a test may freeze it to make ``easy`` deterministic);
    ``shares`` and ``half_life``: the core's fair share between owners (rules 8-10e).
    """

    remote = False  # acquire_now is a call under a lock: the front tries it before waiting
    releases_in_finalizer = True  # release() never waits for a lock (see its docstring)

    def __init__(
        self,
        gpus: Sequence[GPUInfo],
        totals: Sequence[int] | None = None,
        *,
        policy: str = "easy",
        clock: Callable[[], float] = time.monotonic,
        shares: Mapping[Hashable, float] | None = None,
        half_life: float = DEFAULT_HALF_LIFE,
        backfill: str = "limits",
    ) -> None:
        self._gpus = tuple(gpus)
        self._clock = clock  # the core's time, from which it learns hold times
        self._sized = totals is not None
        sizes: int | tuple[int, ...] = len(self._gpus) if totals is None else tuple(totals)
        self._core = Scheduler(
            sizes,
            policy=policy,
            shares=shares,
            half_life=half_life,
            backfill=backfill,
            memory_groups=memory_groups_of(self._gpus),  # MIG devices of one GPU instance
        )
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
        self._released = self._cancelled = self._timed_out = self._revoked_count = 0
        # Time limits (Demand.limit): revoked grants by ticket -> the GPUs whose release is
        # still to come (a no-op then), and the thread that revokes at the deadlines.
        self._revoked: dict[int, set[int]] = {}
        self._deadlines = Deadlines(clock, self._revoke, self._live.__contains__)

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
    def acquire_now(
        self, demand: Demand, expected: float | None = None, claim: list[Grant] | None = None
    ) -> Grant | None:
        """Grant at once where that jumps no waiter, else None; ``expected``: the caller's
        guess of the hold time in seconds, or None to let the core learn it; ``claim``: see
        the base class (the grant is appended the moment it is on our books)."""
        grant = None
        try:
            with self._lock:
                self._owner = get_ident()
                if self._closed:
                    raise PoolClosedError("the GPU pool is closed")
                returns = self._returns
                if self._dirty or len(returns) > 1:  # self._begin(), inline: the hot path
                    self._drain()
                elif returns:
                    item = returns[0]
                    if isinstance(item, _GaveUp):
                        self._drain()
                    else:  # one release handed in (a pair's): self._drain(), inline
                        self._dirty = True
                        returns.popleft()  # released from here on
                        self._released += 1
                        grants = self._core.release_granted(item[0], item[1])
                        if grants:
                            self._collect(grants)
                self._dirty = True
                now = self._clock()
                taken = self._core.grant_now(demand, now=now, expected=expected)
                if taken is not None:
                    self._live[taken.ticket] = grant = taken
                    if claim is not None:
                        claim.append(taken)  # the caller's from here on
                    if demand.limit is not None:
                        self._deadlines.arm(taken.ticket, now + demand.limit)
                self._dirty = False
            if self._wake or self._returns:
                self._settle()
            return grant
        except BaseException:
            self._recover()
            if grant is not None and not claim:  # on our books, but the caller will never see it
                self.release(grant)
            raise

    async def acquire(
        self, demand: Demand, timeout: float | None, expected: float | None = None,
        claim: list[Grant] | None = None,
    ) -> Grant:  # fmt: skip
        """Wait on the running loop; TimeoutError after ``timeout`` seconds."""
        waiter = AsyncWaiter(asyncio.get_running_loop(), time.monotonic(), self._on_lost)
        gave_up = _gave_up((waiter, _CANCELLED)), _gave_up((waiter, _TIMED_OUT))
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
            if claim is not None:
                claim.append(grant)  # the caller's from here on
            return grant
        except BaseException as exc:
            if not claim:  # no signal point before the append (no call): never lost to Ctrl-C
                self._returns.append(gave_up[TimeoutError in exc.__class__.__mro__])
                self._settle()
            raise

    def acquire_blocking(
        self, demand: Demand, timeout: float | None, expected: float | None = None,
        claim: list[Grant] | None = None,
    ) -> Grant:  # fmt: skip
        """Block this thread until granted; TimeoutError after ``timeout`` seconds."""
        waiter = ThreadWaiter(time.monotonic())
        gave_up = _gave_up((waiter, _CANCELLED))
        try:
            grant = self._enqueue(demand, waiter, expected)
            if grant is None:
                woken = waiter.event.wait(timeout)
                grant = _granted_to(waiter) if woken else self._withdraw(waiter, timeout)
            if claim is not None:
                claim.append(grant)  # the caller's from here on
            return grant
        except BaseException:
            if not claim:  # as in acquire: the give-up is handed in before any signal point
                self._returns.append(gave_up)
                self._settle()
            raise

    def _enqueue(
        self, demand: Demand, waiter: Waiter, expected: float | None = None
    ) -> Grant | None:
        """Grant ``demand`` at once (also recorded on ``waiter``), or park ``waiter`` for it."""
        with self._lock:
            self._owner = get_ident()
            if self._closed:
                raise PoolClosedError("the GPU pool is closed")
            if self._returns or self._dirty:  # self._begin(), inline: the hot path
                self._drain()
            self._dirty = True
            waiter.demand, waiter.expected = demand, expected
            now = self._clock()
            ticket, grant = self._core.submit(demand, now=now, expected=expected)
            if grant is None:
                waiter.ticket = ticket
                self._waiters[ticket] = waiter
            else:  # the waiter holds it, so that an exception from here on gives it back
                waiter.grant = grant
                self._live[ticket] = grant
                if demand.limit is not None:
                    self._deadlines.arm(ticket, now + demand.limit)
            self._dirty = False
        if self._wake or self._returns:
            self._settle()
        return grant

    def _withdraw(self, waiter: ThreadWaiter, timeout: float | None) -> Grant:
        """A blocking wait timed out: withdraw it and raise, unless a grant won the race."""
        with self._lock:
            self._owner = get_ident()
            self._begin()
            withdrawn = waiter.grant is None and self._waiters.pop(waiter.ticket, None) is not None
            if withdrawn:
                self._timed_out += 1
                self._collect(self._core.cancel(waiter.ticket, now=self._clock()))
            self._dirty = False
        self._settle()
        if withdrawn:
            raise TimeoutError(f"no GPU capacity granted within timeout={timeout}s")
        return _granted_to(waiter)

    # ----------------------------------------------------------------- giving back
    def release(self, grant: Grant) -> None:
        """Give back ``grant``, or a part of it (same ticket and units, some of its GPUs).

        Raises ValueError, changing nothing, for a grant that is not held (released already,
        or not granted here). Any other exception (Ctrl-C) leaves it released. Never waits for
        a section of its own thread (see module doc).
        """
        ticket = grant.ticket
        try:
            held = self._live.get(ticket)
            if held is grant or held == grant:
                now = self._clock()  # self._hand_in(held), inline: the hot path
                try:
                    del self._live[ticket]; self._returns.append((held, now))  # noqa: E702  # fmt: skip
                except KeyError:  # another thread released it meanwhile, or it was revoked
                    if self._forget_revoked(grant):
                        return
                    raise _not_held(grant) from None
                if self._waiters and not (self._owner == get_ident() and self._lock.locked()):
                    self._settle()  # someone may be waiting for exactly this: apply it now
            elif held is None:
                if not self._forget_revoked(grant):
                    raise _not_held(grant)
            else:
                self._release_part(grant)
        except ValueError:
            raise
        except BaseException:
            self._finish_release(grant)
            self._recover()  # a waiter must not wait for the next call
            raise

    def _finish_release(self, grant: Grant) -> None:
        """Finish a release that an exception (Ctrl-C) cut short before it took effect: the
        caller has taken the grant off its own books already (GPUPool does), so a release
        that raises has had its full effect."""
        held = self._live.get(grant.ticket)
        if held is grant or held == grant:
            self._hand_in(held)
        elif held is not None:
            with contextlib.suppress(ValueError):  # not a part of it, or released already
                self._release_part(grant)

    def _forget_revoked(self, grant: Grant) -> bool:
        """Whether ``grant`` (or a part of it) was revoked when its limit ran out: its release
        is then a no-op, once per GPU (ValueError for a GPU it did not hold then)."""
        left = self._revoked.get(grant.ticket)
        if left is None:
            return False
        gpus = set(grant.gpus)
        if not gpus <= left:
            raise _not_held(grant)
        left -= gpus
        if not left:
            self._revoked.pop(grant.ticket, None)
        return True

    def revoked(self, ticket: int) -> bool:
        """Whether grant ``ticket`` was taken back when its time limit ran out and its holder
        has not released it since."""
        return ticket in self._revoked

    def _revoke(self, ticket: int) -> None:
        """Take back grant ``ticket``, whose time limit ran out (the deadlines' thread calls
        this): its capacity goes back to the pool at once, and its holder's release becomes a
        no-op. A grant released meanwhile is left alone."""
        with self._lock:
            self._owner = get_ident()
            self._begin()
            held = self._live.get(ticket)
            if held is not None:
                # Marked before it leaves _live: a release that misses it there finds it here.
                self._revoked[ticket] = set(held.gpus)
                try:
                    del self._live[ticket]
                except KeyError:  # its holder released it just now (without the lock)
                    del self._revoked[ticket]
                else:
                    self._released += 1
                    self._revoked_count += 1
                    self._collect(self._release_in_core(held, self._clock()))
            self._dirty = False
        self._settle()

    def check_limits(self) -> None:
        """Revoke now, on this thread, what the clock says is due (the limits' thread does so
        by itself; a test whose clock moves by hand calls this)."""
        self._deadlines.run_due()

    def _hand_in(self, held: Grant) -> None:
        """Hand in all of ``held`` (on our books), to be applied by the next section (or the
        enclosing one), dated now; it is released from then on.

        The grant is never off _live without being in _returns: CPython runs signal handlers
        (and raises other asynchronous exceptions) only after a call returns, at a loop's
        back edge or on entering a function, so nothing comes between the `del` and the
        append; and on one line, not even a trace function.
        """
        now = self._clock()
        try:
            del self._live[held.ticket]; self._returns.append((held, now))  # noqa: E702  # fmt: skip
        except KeyError:  # another thread released it meanwhile
            raise _not_held(held) from None

    def _release_part(self, part: Grant) -> None:
        """Release some GPUs of a grant of several; the rest stays held under its ticket."""
        with self._lock:
            self._owner = get_ident()
            held = self._live.get(part.ticket)
            if held is None and self._forget_revoked(part):
                return
            rest = () if held is None else tuple(g for g in held.gpus if g not in part.gpus)
            each = {} if held is None else dict(self._held_by(held))
            if (
                held is None
                or any(part.units not in (held.units, each.get(g)) for g in part.gpus)
                or len(set(part.gpus)) != len(part.gpus)
                or len(rest) + len(part.gpus) != len(held.gpus)
            ):
                raise ValueError(f"{_describe(part)} is not held under grant {part.ticket}")
            # A whole-GPU grant of mixed sizes keeps units 0 (see Scheduler.held).
            kept = Grant(part.ticket, rest, held.units) if rest else None
            parts = [(g, each[g]) for g in part.gpus]
            repair, self._dirty = self._dirty, True
            if kept is not None:  # released from here on (nothing a signal can split)
                self._live[part.ticket] = kept
            else:
                del self._live[part.ticket]
                self._released += 1
            if repair:  # the rebuild reads _live: the part is released there
                self._rebuild()
            else:
                now = self._clock()
                self._collect(self._core.release_many(parts, ticket=part.ticket, now=now))
            self._dirty = False
        self._settle()  # and what others handed in meanwhile

    def _held_by(self, grant: Grant) -> tuple[tuple[int, int], ...]:
        """``(gpu, units)`` that ``grant`` holds on each GPU (as ``Scheduler.held``, read
        without calling the core: nothing before a release's commit may be cut short)."""
        if grant.units:
            return tuple((gpu, grant.units) for gpu in grant.gpus)
        return tuple((gpu, self._totals[gpu]) for gpu in grant.gpus)

    def _recover(self) -> None:
        """After an exception: rebuild the core at once if it cut a section short, so that
        a waiter the section would have granted does not wait for the next call (should a
        second exception cut this short too, the next section does it). Inside this
        thread's own section (a finalizer's release) that section does it."""
        if self._owner == get_ident() and self._lock.locked():
            return
        if self._dirty:
            with self._lock:
                self._owner = get_ident()
                if self._dirty:
                    self._drain()
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
                    waiter = wake[0]  # taken off only once told: an exception loses none
                except IndexError:  # another thread woke it
                    break
                if not waiter.deliver():
                    returns.append(_GaveUp(waiter, _Reason.LOST))
                try:  # noqa: SIM105 (contextlib.suppress costs a call per waiter woken)
                    wake.remove(waiter)
                except ValueError:  # another thread told it too (telling twice is harmless)
                    pass
            if returns:
                if self._owner == get_ident() and self._lock.locked():
                    return
                with self._lock:
                    self._owner = get_ident()
                    self._drain()

    # ----------------------------------------------------------------- under the lock
    def _begin(self) -> None:
        """Start changing things, under the lock: rebuild the core if an exception cut an
        earlier section short, apply what was handed in, and mark the backend dirty until
        this section ends (it sets ``self._dirty = False``)."""
        if self._returns or self._dirty:
            self._drain()
        self._dirty = True

    def _drain(self) -> None:
        """Apply what was handed in without the lock (and repair after an exception)."""
        if self._dirty:
            self._rebuild()
        self._dirty = True
        returns, core = self._returns, self._core
        while returns:
            item = returns[0]
            if isinstance(item, _GaveUp):
                grants = self._give_up(*item)  # done again if cut short: it may be
                returns.popleft()
            else:
                returns.popleft()  # released from here on, whatever cuts this short
                self._released += 1
                grants = core.release_granted(*item)
            if grants:
                self._collect(grants)
        self._dirty = False

    def _release_in_core(self, grant: Grant, now: float | None = None) -> list[Grant]:
        """Give all of ``grant`` (on our books until now) back to the core, at ``now`` (None:
        the core's latest time)."""
        return self._core.release_granted(grant, now)

    def _collect(self, grants: list[Grant]) -> None:
        """Hand each grant to its waiter, to be woken by ``_settle``; a grant whose waiter is
        gone goes straight back, in this loop, not by recursion."""
        i = 0
        waiters = self._waiters
        while i < len(grants):
            grant = grants[i]
            i += 1
            ticket = grant.ticket
            waiter = waiters.get(ticket)
            if waiter is None:
                grants += self._release_in_core(grant)
                continue
            # In this order: a waiter both parked and live is granted (see _rebuild).
            waiter.grant = grant
            self._live[ticket] = grant
            limit = waiter.demand.limit
            if limit is not None:
                self._deadlines.arm(ticket, self._clock() + limit)
            self._wake.append(waiter)
            del waiters[ticket]

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

    def _rebuild(self) -> None:
        """Rebuild the core from our books after an exception cut a section short.

        Held: ``_live`` and the releases handed in but not applied (``_drain`` applies them
        next). Waiting: the parked waiters, in ticket order, less those ``close()`` woke. A
        waiter that is also live was being handed its grant: that is finished here. Whatever
        else the core had (a request queued for a caller that got the exception instead,
        capacity taken by no grant) is gone; the core grants what now fits.
        """
        live, waiters, wake = self._live, self._waiters, self._wake
        for ticket, waiter in list(waiters.items()):
            if ticket in live or waiter.closed:
                if ticket in live and waiter not in wake:
                    wake.append(waiter)
                del waiters[ticket]
            else:
                waiter.grant = None
        returned = [item[0] for item in self._returns if not isinstance(item, _GaveUp)]
        core = self._core
        held = [(grant.ticket, core.held(grant)) for grant in [*live.values(), *returned]]
        waiting = [(ticket, w.demand, w.expected) for ticket, w in waiters.items()]
        self._collect(core.rebuild(held, waiting, now=self._clock()))

    # ----------------------------------------------------------------- introspection
    def snapshot(self) -> PoolSnapshot:
        """Free capacity per GPU, the queue in order and the counters, taken atomically."""
        try:
            return self._snapshot()
        except BaseException:
            self._recover()
            raise

    def _snapshot(self) -> PoolSnapshot:
        now = time.monotonic()
        with self._lock:
            self._owner = get_ident()
            if self._returns or self._dirty:
                self._drain()
            waiting = []
            for entry in self._core.waiters():
                parked = self._waiters.get(entry.ticket)
                waiting.append(_owned(self._waiter_snapshot(entry, parked, now), entry.demand))
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
                revoked=self._revoked_count,
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
        try:
            self._close()
        except BaseException:
            self._recover()
            raise

    def _close(self) -> None:
        with self._lock:
            self._owner = get_ident()
            self._begin()
            self._closed = True
            for waiter in self._waiters.values():
                waiter.closed = True  # first: a closed waiter is no longer waiting
                self._wake.append(waiter)
            self._waiters.clear()
            self._dirty = False
        self._settle()


def _granted_to(waiter: Waiter) -> Grant:
    """The grant a woken waiter received; PoolClosedError if it was woken by ``close()``."""
    if waiter.grant is None:
        raise PoolClosedError("the GPU pool was closed while this request waited")
    return waiter.grant


def _not_held(grant: Grant) -> ValueError:
    return ValueError(
        f"grant {grant.ticket} ({_describe(grant)}) is not held: "
        "it was released already, or was not granted by this pool"
    )


def _describe(grant: Grant) -> str:
    if not grant.units:
        return f"whole GPU(s) {list(grant.gpus)}"
    fraction = units_to_fraction(grant.units)
    return f"{fraction} of GPU(s) {list(grant.gpus)}"


def _owned(snap: WaiterSnapshot, demand: Demand) -> WaiterSnapshot:
    """``snap`` with the owner and priority of ``demand`` (the queue order's, rules 8-10)."""
    if demand.owner is None and not demand.priority:
        return snap
    return dataclasses.replace(snap, owner=demand.owner, priority=demand.priority)
