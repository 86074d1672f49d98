"""UnixBackend: the GPUPool backend that asks ``hwpool serve`` instead of deciding itself.

One connection per process carries every request of every asyncio task (on any loop) and
thread; requests are told apart by ``req``, a key this backend never reuses, which is also
the ticket of the grants it returns. A reader thread reads the server's messages and wakes
the one waiter each concerns: an asyncio waiter through ``call_soon_threadsafe``, a thread
through its own ``threading.Event``.

- **Cancellation**: a waiter that gives up sends ``withdraw``, which the server applies to
  whatever the request has become (waiting: withdrawn; granted meanwhile: given back), and
  any grant that was already on its way is dropped on arrival.
- **Losing the server**: the reader reconnects with backoff for up to ``reconnect_timeout``
  (None: for as long as it takes); on the new connection it re-declares every lease and
  waiter (``reclaim``, in the original order) and every request made meanwhile, then
  ``reclaimed``. A lease the new server cannot take back is reported as lost. If no server
  comes back in time, waiters raise ConnectionError and leases are dropped. A connection
  lost while nothing was held or waited for is made again by the next request, which waits
  for it the same way (bounded by ``reconnect_timeout`` and its own timeout): no caller ever
  dials, so no caller (an event loop above all) waits for a server that does not answer.
- **Never dropped**: a request is registered and its message posted in one section; when
  there is no connection then, a connection thread is started (or one is running) and sends
  it once connected. So a request is always sent, or fails with an error.
- **Hand-over**: ``give`` offers a lease to another connection of the same user and forgets it
  at once (this backend never releases nor re-declares it again; the server keeps it on this
  connection until it is taken, and frees it if this connection closes first); ``take``
  makes a lease given elsewhere this backend's, like one it was granted.

Its parts, each with one job (a chain of classes, each adding to the one below):
``_unix_requests`` (the records of requests and calls, a thread's wait),
``_unix_link`` (state, sections, outbox, wake-ups, dialing, the reader thread, fork),
``_unix_reconnect`` (a lost connection made again or given up), ``_unix_handover``
(``give`` and ``take``), ``_unix_replies`` (each server message applied); this module adds
acquiring, releasing, status and close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from threading import get_ident

from .._check import check_int
from .._core._capacity import units_to_fraction
from .._core._scheduler import Demand, Grant
from .._errors import PoolClosedError
from .._host._detect import GPUInfo
from .._wire._connection import Wire
from .._wire._paths import SOCKET_VAR
from .._wire._protocol import (
    MAX_PRIORITY,
    Acquire,
    Bye,
    Release,
    Status,
    StatusReply,
    WaiterRecord,
    Withdraw,
    encode,
)
from ._base import PoolSnapshot, WaiterSnapshot
from ._unix_replies import _UnixReplies
from ._unix_requests import (
    CLOSE_TIMEOUT_S,
    REPLY_TIMEOUT_S,
    SNAPSHOT_TRIES,
    _Call,
    _label,
    _Req,
    _State,
    _wait,
)

__all__ = ["SOCKET_VAR", "UnixBackend"]


class UnixBackend(_UnixReplies):
    """A client of the host server on ``socket`` (default: see ``hwpool serve``).

    Connects at once: ConnectionError, naming the socket and how to start a server, if none
    answers within ``connect_timeout`` seconds. ``reconnect_timeout`` bounds how long a lost
    server is waited for (None: until it is back), by requests that wait and by leases held
    (dropped after it). ``name`` and ``command`` label every request of this backend in
    ``hwpool status`` (at most 4096 characters each).
    """

    remote = True  # acquire_now is a round trip: the front queues at once instead

    def __repr__(self) -> str:
        return f"UnixBackend(socket={str(self._path)!r}, num_gpus={len(self._gpus)})"

    @property
    def gpus(self) -> tuple[GPUInfo, ...]:
        """The server's GPUs, in index order."""
        return self._gpus

    @property
    def gpu_memory(self) -> tuple[int, ...] | None:
        """Each GPU's capacity in MiB when the server is sized in memory, else None."""
        return self._totals

    @property
    def socket(self) -> Path:
        """The socket this backend connects to."""
        return self._path

    def lease_id(self, ticket: int) -> int | None:
        """The server's id (as ``hwpool status`` shows it) of the request whose grants carry
        ``ticket``, or None when it has none (not known to the server yet, or gone)."""
        r = self._reqs.get(ticket)
        return None if r is None else r.id

    def held_since(self, ticket: int) -> float | None:
        """When grant ``ticket``'s lease was granted, on this process's ``time.monotonic()``
        (the clock the server counts time limits on): for a lease taken over, its first
        grant, from the age the server gave with it. None where no such grant is held here."""
        r = self._reqs.get(ticket)
        return None if r is None or r.state is not _State.HELD else r.since

    # ----------------------------------------------------------------- acquiring
    def _submit(
        self,
        demand: Demand,
        wait: bool,
        loop: asyncio.AbstractEventLoop | None,
        expected: float | None = None,
        *,
        name: str | None = None,
        command: str | None = None,
    ) -> _Req:
        """Register and send the request for ``demand``, labelled ``name`` and ``command``
        (None: this backend's own labels)."""
        if demand.priority:  # ValueError naming it, before anything is sent
            check_int("priority", demand.priority, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)
        name = self._name if name is None else _label("name", name)
        command = self._command if command is None else _label("command", command)
        self._connected()
        with self._section():
            if self._closed:
                raise PoolClosedError("the GPU pool is closed")
            r = _Req(next(self._keys), demand, wait, loop, expected, name=name, command=command)
            self._reqs[r.key] = r
            count, units, unit = self._asked(demand)
            self._send_or_connect(  # the owner is the uid the server sees; the priority is sent
                Acquire(r.key, count, units, wait, name, command, expected, unit,
                        demand.priority, demand.limit)
            )  # fmt: skip
        return r

    async def acquire(
        self,
        demand: Demand,
        timeout: float | None,
        expected: float | None = None,
        claim: list[Grant] | None = None,
        *,
        name: str | None = None,
        command: str | None = None,
    ) -> Grant:
        """Wait in the server's queue on the running loop; TimeoutError after ``timeout``.
        ``name`` and ``command`` label this request in ``hwpool status`` instead of the
        backend's own labels (here and in ``acquire_blocking``, ``acquire_now``; at most 4096
        characters each: ValueError naming the argument otherwise).

        Nothing here blocks the loop: the request is posted (or left to the connection
        thread) and its answer awaited. ``timeout=0`` asks for a grant now (no queueing),
        awaited for at most REPLY_TIMEOUT_S.
        """
        now_only = timeout == 0
        loop = asyncio.get_running_loop()
        r = self._submit(demand, not now_only, loop, expected, name=name, command=command)
        assert r.future is not None
        try:
            if timeout is None:
                await r.future
            else:
                async with asyncio.timeout(REPLY_TIMEOUT_S if now_only else timeout):
                    await r.future
            grant = r.grant()
        except BaseException as exc:
            self._abandon(r, timed_out=isinstance(exc, TimeoutError))
            raise
        if grant is None:  # now_only, and it would have to wait
            with self._section():
                self._timed_out += 1
            raise TimeoutError(f"no GPU capacity granted within timeout={timeout}s")
        if claim is not None:
            claim.append(grant)
        return grant

    def acquire_blocking(
        self,
        demand: Demand,
        timeout: float | None,
        expected: float | None = None,
        claim: list[Grant] | None = None,
        *,
        name: str | None = None,
        command: str | None = None,
    ) -> Grant:
        """Block this thread until the server grants; TimeoutError after ``timeout``
        (``timeout=0``: a grant now or TimeoutError, as ``acquire``)."""
        if timeout == 0:
            grant = self.acquire_now(demand, expected, claim, name=name, command=command)
            if grant is None:
                with self._section():
                    self._timed_out += 1
                raise TimeoutError(f"no GPU capacity granted within timeout={timeout}s")
            return grant
        r = self._submit(demand, True, None, expected, name=name, command=command)
        try:
            if not _wait(r, timeout):
                self._time_out(r, timeout)
            grant = r.grant()
        except BaseException as exc:
            self._abandon(r, timed_out=isinstance(exc, TimeoutError))
            raise
        assert grant is not None
        if claim is not None:
            claim.append(grant)
        return grant

    def _time_out(self, r: _Req, timeout: float | None) -> None:
        """Withdraw ``r`` after its timeout and raise, unless a grant won the race."""
        with self._section():
            if r.state is _State.HELD or r.error is not None:
                return
            if self._reqs.pop(r.key, None) is r:
                self._timed_out += 1
                self._post(Withdraw(next(self._keys), r.key, timed_out=True))
        raise TimeoutError(f"no GPU capacity granted within timeout={timeout}s")

    def acquire_now(
        self,
        demand: Demand,
        expected: float | None = None,
        claim: list[Grant] | None = None,
        *,
        name: str | None = None,
        command: str | None = None,
    ) -> Grant | None:
        """Ask the server for a grant that jumps no waiter; None if it would have to wait
        (ConnectionError if no answer comes within REPLY_TIMEOUT_S)."""
        r = self._submit(demand, False, None, expected, name=name, command=command)
        try:
            if not _wait(r, REPLY_TIMEOUT_S):
                raise ConnectionError(f"no reply from the hwpool server on {str(self._path)!r}")
            grant = r.grant()
        except BaseException:
            self._abandon(r, timed_out=False)
            raise
        if grant is not None and claim is not None:
            claim.append(grant)
        return grant

    # ----------------------------------------------------------------- releasing
    def revoked_for_overuse(self, ticket: int) -> bool:
        """Whether grant ``ticket`` was ended for overuse (the server's ``over_lease term``)."""
        return ticket in self._overuse_keys

    def revoked_by_limit(self, ticket: int) -> bool:
        """Whether grant ``ticket`` was revoked because its time limit ran out (and not
        released since)."""
        return ticket in self._timed_out_keys

    def revoked(self, ticket: int) -> bool:
        """Whether grant ``ticket`` is no longer held although not released: revoked (its time
        limit, ``hwpool cancel``), lost in a restart, or inherited over fork."""
        return ticket in self._orphans

    def release(self, grant: Grant) -> None:
        """Give back ``grant`` or some of its GPUs; ValueError, changing nothing, if not held.

        A lease revoked by ``hwpool cancel``, lost in a restart, or inherited over fork is
        released as a no-op. After ``close()`` releasing does nothing: closing gave it back.
        """
        r = self._reqs.get(grant.ticket)
        if r is None or r.state is not _State.HELD:
            if grant.ticket in self._handed:
                raise ValueError(
                    f"grant {grant.ticket} (lease #{self._handed[grant.ticket]} on GPU(s) "
                    f"{list(grant.gpus)}) was handed over (give): it is no longer this pool's "
                    "to release"
                )
            if grant.ticket in self._orphans or self._closed:
                self._orphans.discard(grant.ticket)
                self._timed_out_keys.discard(grant.ticket)
                self._overuse_keys.discard(grant.ticket)
                return
            raise ValueError(
                f"grant {grant.ticket} ({units_to_fraction(grant.units)} of GPU(s) "
                f"{list(grant.gpus)}) is not held: it was released already, or was not "
                "granted by this pool"
            )
        rest = tuple(g for g in r.gpus if g not in grant.gpus)
        each = dict(self._held(r))  # a part of whole GPUs of mixed sizes names its GPU's total
        if (
            any(grant.units not in (r.units, each.get(g)) for g in grant.gpus)
            or len(set(grant.gpus)) != len(grant.gpus)
            or len(rest) + len(grant.gpus) != len(r.gpus)
        ):
            raise ValueError(f"GPUs {list(grant.gpus)} are not held under grant {grant.ticket}")
        self._defer(lambda: self._give_back(r, grant.gpus, rest))

    def _give_back(self, r: _Req, gpus: tuple[int, ...], rest: tuple[int, ...]) -> None:
        if self._reqs.get(r.key) is not r:
            return  # revoked or lost in the meantime
        if not rest:
            del self._reqs[r.key]
            self._released += 1
            self._post(Release(next(self._keys), r.key))
            return
        held = dict(self._held(r))
        r.gpus = rest
        for gpu in gpus:
            self._post(Release(next(self._keys), r.key, gpu, held[gpu]))

    def demand_of(self, ticket: int) -> Demand | None:
        """The demand grant ``ticket`` was asked with (for a lease taken over: as its giver
        asked), or None where this backend holds no such grant."""
        r = self._reqs.get(ticket)
        return None if r is None else r.demand

    # ----------------------------------------------------------------- the rest
    def snapshot(self) -> PoolSnapshot:
        """The host's capacity and queue as the server sees them, with this pool's own counters.

        It reads this process's own writes: if, while the answer was on its way, this backend
        sent something more (a withdraw in answer to a grant that came before the status, a
        release from another thread), it asks again, a few times at most. After ``close()``
        it asks over a connection of its own.
        """
        if self._closed:
            return self._snapshot_once()
        for _ in range(SNAPSHOT_TRIES):
            reply, settled = self._status()
            if settled:
                break
        with self._section():
            counters = (self._granted, self._released, self._cancelled, self._timed_out)
            revoked = self._revoked_count
        return dataclasses.replace(_snapshot(reply, counters, self._totals), revoked=revoked)

    def status(self) -> StatusReply:
        """The server's whole status, over this backend's own connection (no other one is
        opened: ``hwpool run``'s wait line asks through the connection its request uses)."""
        return self._status()[0]

    def _status(self) -> tuple[StatusReply, bool]:
        """One status round trip, and whether nothing else was sent after its request."""
        self._connected()
        with self._section():
            key = next(self._keys)
            call = self._calls[key] = _Call(Status(key, stream=True))
            self._send_or_connect(Status(key, stream=True))
            posted = self._posted
        if not _wait(call, REPLY_TIMEOUT_S):
            with self._section():
                self._calls.pop(key, None)
            raise ConnectionError(f"no status from the hwpool server on {str(self._path)!r}")
        if call.error is not None:
            raise call.error
        assert isinstance(call.reply, StatusReply)
        return call.reply, self._posted == posted

    def _snapshot_once(self) -> PoolSnapshot:
        wire = Wire(self._path, role="control")
        try:
            reply = wire.status()
        finally:
            wire.shutdown()
        counters = (self._granted, self._released, self._cancelled, self._timed_out)
        snap = _snapshot(reply, counters, self._totals)
        return dataclasses.replace(snap, revoked=self._revoked_count)

    def close(self) -> None:
        """Say goodbye: the server gives back everything this process held or waited for
        before this returns (bounded); waiting requests raise PoolClosedError; later releases
        are no-ops. Idempotent."""
        bye = _Call()
        with self._section():
            if self._closed:
                return
            self._closed = True
            wire, self._wire = self._wire, None
            self._drop_all(PoolClosedError("the GPU pool was closed while this request waited"))
            for call in self._calls.values():
                call.error = PoolClosedError("the GPU pool is closed")
                self._to_wake.append(call)
            self._calls.clear()
            key = next(self._keys)
            self._calls[key] = bye
        if wire is None:
            return
        try:
            with self._send_lock, contextlib.suppress(OSError):
                wire.send_bytes(encode(Bye(key)))
            if get_ident() not in self._readers:  # (a finalizer on the reader cannot wait)
                _wait(bye, CLOSE_TIMEOUT_S)  # not holding the send lock: no sender waits on it
        finally:
            wire.shutdown()  # even if Ctrl-C cut the wait short


def _snapshot(
    reply: StatusReply, counters: tuple[int, int, int, int], totals: tuple[int, ...] | None
) -> PoolSnapshot:
    """The host's capacity and queue, with this pool's own counters (as a local pool's);
    ``totals``: MiB per GPU on a server sized in memory."""
    granted, released, cancelled, timed_out = counters
    if totals is None:
        free = tuple(units_to_fraction(u) for u in reply.free)
    else:
        free = tuple(u / t for u, t in zip(reply.free, totals, strict=True))
    return PoolSnapshot(
        num_gpus=len(reply.free),
        free=free,
        waiting=tuple(_waiter(w, totals) for w in reply.waiting),
        granted=granted,
        released=released,
        cancelled=cancelled,
        timed_out=timed_out,
        free_mib=None if totals is None else reply.free,
        total_mib=totals,
    )


def _waiter(w: WaiterRecord, totals: tuple[int, ...] | None) -> WaiterSnapshot:
    """One waiter of a status reply as a local pool shows it."""
    if w.unit == "mib" and totals is not None:
        return WaiterSnapshot(w.count, w.units / max(totals), w.reserved, w.age_s, w.units)
    return WaiterSnapshot(w.count, units_to_fraction(w.units), w.reserved, w.age_s)
