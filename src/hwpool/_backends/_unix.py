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
- **Fork**: the child forgets the parent's connection and requests (their releases become
  no-ops there) and opens its own connection on first use.
- **Locking**: state is changed in *sections* (the lock, with its owner noted). What may run
  in a finalizer (a release, an abandoned waiter, a delivery a closed loop dropped) never
  waits for a section of its own thread: it is queued and run when that section ends.
  Messages are queued in an outbox under the lock and sent after it, so the reader thread
  never waits for a sender.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import itertools
import logging
import math
import os
import pwd
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from threading import get_ident

from .._check import check_int, check_timeout
from .._core._capacity import UNITS_PER_GPU, units_to_fraction
from .._core._demand import make_demand
from .._core._scheduler import Demand, Grant
from .._errors import PoolClosedError, RevokedError
from .._host._detect import GPUInfo
from .._printable import printable
from .._wire._connection import Wire
from .._wire._paths import SOCKET_VAR, client_socket
from .._wire._protocol import (
    MAX_PRIORITY,
    MAX_TEXT,
    TICKET,
    Acquire,
    Busy,
    Bye,
    ClientMessage,
    Done,
    ErrorCode,
    ErrorReply,
    Give,
    Given,
    Granted,
    Notice,
    Queued,
    Reclaim,
    Reclaimed,
    Release,
    Revoked,
    ServerMessage,
    Status,
    StatusPart,
    StatusReply,
    Take,
    TakenRequest,
    Unit,
    WaiterRecord,
    Withdraw,
    encode,
    join_status,
    request_for,
)
from ._base import PoolSnapshot, WaiterSnapshot

__all__ = ["SOCKET_VAR", "UnixBackend"]

_log = logging.getLogger("hwpool")
REPLY_TIMEOUT_S = 60.0  # a status or nowait reply that takes longer means the server hangs
SNAPSHOT_TRIES = 5  # status round trips a snapshot makes at most to include its own writes
CLOSE_TIMEOUT_S = 5.0  # how long close() waits for the server to confirm it freed everything
RETRY_FIRST_S = 0.01  # the first pause between two attempts to reach a lost server
RETRY_MAX_S = 0.5  # the longest pause (it doubles from the first up to this)
DIAL_TIMEOUT_S = 10.0  # how long connecting and the hello may take at most
SIGNAL_SLICE_S = 0.2  # the main thread's waits end this often, to act on a signal (see _wait)


class _State(enum.Enum):
    SENT = "sent"  # sent, no answer yet
    QUEUED = "queued"  # waiting in the server's queue as ``id``
    HELD = "held"  # granted: holds ``units`` on each of ``gpus``


class _Req:
    """One request of this process, from ``acquire`` until it is released or fails."""

    __slots__ = (
        "answered", "asked", "command", "demand", "error", "expected", "future", "gpus", "id",
        "key", "loop", "name", "since", "state", "units", "wait", "wake",
    )  # fmt: skip

    def __init__(
        self,
        key: int,
        demand: Demand,
        wait: bool,
        loop: asyncio.AbstractEventLoop | None,
        expected: float | None = None,
        *,
        name: str | None = None,
        command: str | None = None,
    ) -> None:
        self.key = key
        self.demand = demand
        self.expected = expected
        self.name = name  # its labels in ``hwpool status`` (the backend's, or its own)
        self.command = command
        self.asked: tuple[int, int, Unit] | None = None  # a lease taken over: as it was asked
        self.wait = wait
        self.loop = loop
        self.future: asyncio.Future[None] | None = None if loop is None else loop.create_future()
        self.wake: threading.Lock | None = _token() if loop is None else None
        self.answered = False  # a thread waiter's truth (the token only ends its sleep)
        self.state = _State.SENT
        self.id: int | None = None
        self.gpus: tuple[int, ...] = ()
        self.units = 0  # granted on each GPU (0: whole GPUs of different sizes)
        self.since = time.monotonic()
        self.error: BaseException | None = None

    def grant(self) -> Grant | None:
        """What the request holds, or None (refused nowait); raises the error it failed with."""
        if self.error is not None:
            raise self.error
        return Grant(self.key, self.gpus, self.units) if self.state is _State.HELD else None


class _Call:
    """A request answered once (status, bye): a thread waits for ``reply`` (see ``_wait``).

    ``message`` is what asks for it: sent at once, or by the connection thread once connected.
    ``parts`` gathers the ``status_part`` lines of a streamed status before its last line.
    """

    __slots__ = ("answered", "error", "giving", "message", "parts", "reply", "wake")

    def __init__(self, message: ClientMessage | None = None, giving: int | None = None) -> None:
        self.wake = _token()
        self.answered = False
        self.message = message
        self.giving = giving  # a ``give``: the key of the request whose lease it offers
        self.reply: ServerMessage | None = None
        self.error: BaseException | None = None
        self.parts: list[StatusPart] = []


class _Delivery:
    """Resolves the futures of waiters of one loop, answered together (one hand-over to that
    loop, however many answers one read brought); if the loop drops it unrun, gives their
    grants back."""

    __slots__ = ("backend", "reqs")

    def __init__(self, backend: UnixBackend, reqs: list[_Req]) -> None:
        self.backend: UnixBackend | None = backend
        self.reqs = reqs

    def __call__(self) -> None:
        self.backend = None
        for req in self.reqs:
            future = req.future
            if future is not None and not future.done():
                future.set_result(None)

    def __del__(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            for req in self.reqs:
                backend._abandon(req, timed_out=False, lost=True)


class _Opened:
    """The connections a backend opened in this process, closed when the backend is collected."""

    __slots__ = ("pid", "wires")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.wires: list[Wire] = []

    def close_all(self) -> None:
        for wire in self.wires:
            if self.pid == os.getpid():
                wire.shutdown()
            else:  # a forked child's copy: closing it leaves the parent's connection alone
                wire.sock.close()
        self.wires.clear()


_BACKENDS: weakref.WeakSet[UnixBackend] = weakref.WeakSet()


def _forget_parents() -> None:
    for backend in list(_BACKENDS):
        backend._after_fork()


os.register_at_fork(after_in_child=_forget_parents)


class UnixBackend:
    """A client of the host server on ``socket`` (default: see ``hwpool serve``).

    Connects at once: ConnectionError, naming the socket and how to start a server, if none
    answers within ``connect_timeout`` seconds. ``reconnect_timeout`` bounds how long a lost
    server is waited for (None: until it is back), by requests that wait and by leases held
    (dropped after it). ``name`` and ``command`` label every request of this backend in
    ``hwpool status`` (at most 4096 characters each).
    """

    remote = True  # acquire_now is a round trip: the front queues at once instead

    def __init__(self, socket: str | os.PathLike[str] | None = None, *,
                 reconnect_timeout: float | None = 30.0, name: str | None = None,
                 command: str | None = None,
                 connect_timeout: float = DIAL_TIMEOUT_S) -> None:  # fmt: skip
        self._path: Path = client_socket(socket).path
        self._token = secrets.token_hex(16)  # names this pool to the server, over reconnects
        bound = check_timeout(reconnect_timeout, "reconnect_timeout")
        self._reconnect_s = math.inf if bound is None else bound
        dial_s = check_timeout(connect_timeout, "connect_timeout")
        if dial_s is None or dial_s <= 0:
            raise ValueError(f"connect_timeout must be a number > 0, got {connect_timeout!r}")
        self._name = _label("name", name)
        self._command = _label("command", command)
        self._lock = threading.Lock()
        self._owner = 0
        self._send_lock = threading.Lock()
        self._send_owner = 0
        self._connect_lock = threading.Lock()
        self._keys = itertools.count(1)
        self._reqs: dict[int, _Req] = {}
        self._calls: dict[int, _Call] = {}
        self._orphans: set[int] = set()  # keys whose release is a no-op (revoked, lost, forked)
        self._handed: dict[int, int] = {}  # keys of leases handed over (give) -> their ids
        self._later: collections.deque[Callable[[], None]] = collections.deque()
        self._outbox: collections.deque[bytes] = collections.deque()
        self._to_wake: list[_Req | _Call] = []
        self._wire: Wire | None = None
        self._reconnecting = False
        self._closed = False
        self._gpus: tuple[GPUInfo, ...] = ()
        self._totals: tuple[int, ...] | None = None  # MiB per GPU on a server sized in memory
        self._welcomed = False
        self._readers: set[int] = set()  # idents of this backend's reader threads
        self._granted = self._released = self._cancelled = self._timed_out = 0
        self._revoked_count = 0  # leases the server took back when their time limit ran out
        self._timed_out_keys: set[int] = set()  # of those, the ones not released since
        self._overuse_keys: set[int] = set()  # leases ended for overuse, not released since
        self._posted = 0  # messages queued for the server, ever (snapshots compare it)
        self._opened = _Opened()
        weakref.finalize(self, self._opened.close_all)
        self._open(dial_s)
        _BACKENDS.add(self)

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

    # ----------------------------------------------------------------- sections
    @contextlib.contextmanager
    def _section(self) -> Iterator[None]:
        """Hold the state lock; then wake, send and run what was deferred meanwhile."""
        with self._lock:
            self._owner = get_ident()
            try:
                yield
                while self._later:
                    self._later.popleft()()
            finally:
                self._owner = 0
                wake, self._to_wake = self._to_wake, []
        if wake:
            self._wake(wake)
        self._pump()
        if self._later:
            self._flush()

    def _defer(self, op: Callable[[], None]) -> None:
        """Run ``op`` in a section, now or, inside one of this thread's, when that one ends."""
        self._later.append(op)
        self._flush()

    def _flush(self) -> None:
        while self._later:
            if self._owner == get_ident() and self._lock.locked():
                return
            with self._section():
                pass

    def _post(self, message: ClientMessage) -> None:
        """In a section: queue ``message`` for the current connection (none: nothing to say)."""
        if self._wire is not None:
            self._outbox.append(encode(message))
            self._posted += 1

    def _pump(self) -> None:
        """Send the outbox, unless this thread is sending already (then that send will)."""
        while self._outbox and self._send_owner != get_ident():
            with self._send_lock:
                self._send_owner = get_ident()
                try:
                    lines = []
                    with contextlib.suppress(IndexError):
                        while True:
                            lines.append(self._outbox.popleft())
                    wire = self._wire
                    if wire is not None and lines:
                        with contextlib.suppress(OSError):  # the reader sees the loss
                            wire.send_bytes(b"".join(lines))
                finally:
                    self._send_owner = 0

    def _wake(self, items: list[_Req | _Call]) -> None:
        """Wake the waiters of ``items``: a thread through its token, the waiters of one
        event loop through one ``call_soon_threadsafe`` for all of them (each is one write
        to the loop's wake-up pipe, and one turn of that loop)."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Req]] = {}
        for item in items:
            if item.wake is not None:
                item.answered = True  # first: a waiter woken by the token reads it
                with contextlib.suppress(RuntimeError):  # given already
                    item.wake.release()
                continue
            assert isinstance(item, _Req) and item.loop is not None
            by_loop.setdefault(item.loop, []).append(item)
        for loop, reqs in by_loop.items():
            delivery = _Delivery(self, reqs)
            try:
                loop.call_soon_threadsafe(delivery)
            except RuntimeError:  # its loop is closed: nobody will take these grants
                delivery.backend = None
                for req in reqs:
                    self._abandon(req, timed_out=False, lost=True)

    # ----------------------------------------------------------------- connecting
    def _dial(self, timeout: float = DIAL_TIMEOUT_S) -> Wire:
        """A welcomed connection to a server that counts capacity as this library does."""
        wire = Wire(self._path, timeout, token=self._token)
        if wire.welcome.units_per_gpu != UNITS_PER_GPU:
            wire.shutdown()
            raise _Incompatible(
                f"the hwpool server on {str(self._path)!r} ({wire.welcome.server}) counts "
                f"{wire.welcome.units_per_gpu} units per GPU, this hwpool {UNITS_PER_GPU}: "
                "run the same version of hwpool on both sides"
            )
        if self._welcomed and wire.welcome.totals != self._totals:
            wire.shutdown()
            raise _Incompatible(
                f"the hwpool server on {str(self._path)!r} came back with GPUs of other sizes "
                f"({wire.welcome.totals} MiB, was {self._totals}): what this process holds "
                "cannot be taken back there"
            )
        self._opened.wires.append(wire)
        return wire

    def _open(self, timeout: float) -> None:
        """Connect (ConnectionError if no server answers in time) and start reading."""
        wire = self._dial(timeout)
        with self._section():
            self._wire = wire
            self._gpus, self._totals = wire.welcome.gpus, wire.welcome.totals
            self._welcomed = True
        self._start_reader(wire)

    def _start_reader(self, wire: Wire | None) -> None:
        """Start the connection thread: it reads ``wire`` (None: it connects first)."""
        thread = threading.Thread(
            target=_read, args=(weakref.ref(self), wire), name="hwpool-unix-reader", daemon=True
        )
        thread.start()
        if thread.ident is not None:
            self._readers.add(thread.ident)

    def _connected(self) -> None:
        """Before a request: refuse if closed. (Connecting is the connection thread's: a
        request made with no connection is sent by it, see ``_send_or_connect``.)"""
        if self._closed:
            raise PoolClosedError("the GPU pool is closed")

    def _send_or_connect(self, message: ClientMessage) -> None:
        """In a section: post ``message``, or, with no connection, have one made (the
        connection thread sends it then: a request waiting in ``_reqs`` or ``_calls`` is
        declared on every new connection)."""
        if self._wire is not None:
            self._post(message)
        elif not self._reconnecting:
            self._reconnecting = True
            self._start_reader(None)

    def _lost(self, wire: Wire, reason: ConnectionError) -> bool:
        """The reader lost ``wire``: whether to connect again (something is held or waited
        for); status calls sent on it fail with ``reason``."""
        with self._section():
            if self._wire is not wire:
                return False  # closed, or this process forked: not ours to repair
            self._wire = None
            with contextlib.suppress(ValueError):
                self._opened.wires.remove(wire)
            wire.sock.close()
            for call in self._calls.values():
                call.error = reason
                self._to_wake.append(call)
            self._calls.clear()
            if not self._reqs:
                return False  # nothing to keep: the next request connects again
            self._reconnecting = True
            return True

    def _reconnect(self) -> Wire | None:
        """The connection thread, with no connection: dial with backoff until a server
        answers (then re-declare everything on it), nothing is left to declare, the pool is
        closed, or ``reconnect_timeout`` passes (then fail what waits, drop what is held)."""
        deadline = time.monotonic() + self._reconnect_s
        delay = RETRY_FIRST_S
        reason = ConnectionError("no attempt made")
        while self._wanted():
            try:
                new = self._dial(max(0.1, min(DIAL_TIMEOUT_S, deadline - time.monotonic())))
            except _Incompatible as exc:  # a server answered, and what is held cannot go there
                reason = exc
                break
            except ConnectionError as exc:
                reason = exc
                if time.monotonic() + delay >= deadline:
                    break
                time.sleep(delay)  # backoff between attempts, bounded by the deadline
                delay = min(2 * delay, RETRY_MAX_S)
                continue
            if self._resume(new):
                return new
            new.shutdown()
            return None
        else:
            return None
        self._give_up(reason)
        return None

    def _wanted(self) -> bool:
        """Whether the connection thread should go on dialing: not closed, and something is
        held or waited for (else it stops, and the next request starts it again)."""
        with self._section():
            if not self._closed and (self._reqs or self._calls):
                return True
            self._reconnecting = False
            return False

    def _resume(self, wire: Wire) -> bool:
        """Re-declare every lease and waiter on ``wire``, in their original order, and send
        the status calls made while there was no connection."""
        with self._send_lock:
            self._send_owner = get_ident()
            try:
                with self._section():
                    if self._closed:
                        return False
                    lines = [encode(m) for m in self._declarations()]
                    lines += [encode(c.message) for c in self._calls.values() if c.message]
                    self._outbox.clear()  # superseded by the declarations
                    self._wire, self._reconnecting = wire, False
                    self._gpus = wire.welcome.gpus
                with contextlib.suppress(OSError):
                    wire.send_bytes(b"".join(lines))
            finally:
                self._send_owner = 0
        self._pump()
        _log.info("hwpool: connected to %s; declared %d requests", self._path, len(lines) - 1)
        return True

    def _declarations(self) -> list[ClientMessage]:
        now = time.monotonic()
        out: list[ClientMessage] = []
        for r in sorted(self._reqs.values(), key=lambda r: r.key):
            count, units, unit = self._asked(r.demand)
            if r.id is None:
                out.append(
                    Acquire(r.key, count, units, r.wait, r.name, r.command, r.expected,
                            unit, r.demand.priority, r.demand.limit)
                )  # fmt: skip
            else:
                if r.asked is not None:  # taken over: re-declared as it was asked
                    count, units, unit = r.asked
                held = self._held(r) if r.state is _State.HELD else None
                age = now - r.since
                out.append(
                    Reclaim(r.key, r.id, count, units, held, age, r.name, r.command, unit,
                            r.demand.limit)
                )  # fmt: skip
        out.append(Reclaimed(next(self._keys)))
        return out

    def _give_up(self, reason: ConnectionError) -> None:
        """No server to go back to: fail every request and status call, drop the leases."""
        if isinstance(reason, _Incompatible):
            error = ConnectionError(str(reason))
        else:
            error = ConnectionError(
                f"lost the hwpool server on {str(self._path)!r} and none answered within "
                f"reconnect_timeout={self._reconnect_s:g}s ({reason})"
            )
        with self._section():
            self._reconnecting = False
            self._drop_all(error)
            for call in self._calls.values():
                call.error = error
                self._to_wake.append(call)
            self._calls.clear()
        _log.warning("hwpool: %s; leases held are dropped", error)

    def _drop_all(self, error: BaseException) -> None:
        """In a section: fail every waiting request with ``error``; held leases are dropped."""
        for r in self._reqs.values():
            if r.state is _State.HELD:
                self._orphans.add(r.key)
            else:
                r.error = error
                self._to_wake.append(r)
        self._reqs.clear()

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connection and requests (they are its)."""
        self._lock, self._send_lock = threading.Lock(), threading.Lock()
        self._connect_lock = threading.Lock()
        self._owner = self._send_owner = 0
        self._orphans |= {r.key for r in self._reqs.values() if r.state is _State.HELD}
        self._reqs.clear()
        self._calls.clear()
        self._later.clear()
        self._outbox.clear()
        self._to_wake = []
        self._wire, self._reconnecting = None, False
        self._token = secrets.token_hex(16)  # the child is a client of its own
        self._opened.close_all()  # this process's copies only: the parent's connection lives on
        self._opened.pid = os.getpid()

    # ----------------------------------------------------------------- the reader's side
    def _dispatch(self, messages: list[ServerMessage]) -> None:
        """Apply ``messages`` (what one read brought) in one section: their waiters are woken
        together when it ends."""
        with self._section():
            for message in messages:
                self._apply(message)

    def _apply(self, message: ServerMessage) -> None:
        """In a section: what one server message changes."""
        match message:
            case Granted() if message.req in self._calls:  # the answer to a take
                self._on_taken(message)
            case Granted():
                self._on_granted(message)
            case Given():
                self._on_given(message)
            case Queued():
                r = self._reqs.get(message.req)
                if r is not None:
                    r.id = message.id
                    if r.state is _State.SENT:
                        r.state = _State.QUEUED
            case Busy():
                r = self._reqs.pop(message.req, None)
                if r is not None:
                    self._to_wake.append(r)
            case ErrorReply():
                self._on_error(message)
            case Revoked():
                self._on_revoked(message)
            case Notice():
                _log.warning("%s", message.text)  # on the job's stderr (hwpool run, a job)
            case StatusPart():
                call = self._calls.get(message.req)
                if call is not None:
                    call.parts.append(message)
            case StatusReply():
                call = self._calls.pop(message.req, None)
                if call is not None:
                    call.reply = join_status(call.parts, message)
                    self._to_wake.append(call)
            case Done():
                call = self._calls.pop(message.req, None)
                if call is not None:
                    call.reply = message
                    self._to_wake.append(call)

    def _on_granted(self, message: Granted) -> None:
        r = self._reqs.get(message.req)
        if r is None:
            if message.request is not None:  # a take whose caller stopped waiting: give it back
                self._post(Release(next(self._keys), message.req))
            return  # withdrawn on the way: the withdraw gives it back
        r.id = message.id
        if r.state is _State.HELD:
            return  # a reclaimed lease, confirmed
        r.state, r.gpus, r.since = _State.HELD, message.gpus, time.monotonic()
        r.units = message.units
        self._granted += 1
        self._to_wake.append(r)

    def _on_taken(self, message: Granted) -> None:
        """A lease taken over (the answer to a ``take``): from now on it is this backend's,
        held under the take's key, as if it had been granted here."""
        call = self._calls.pop(message.req)
        request = message.request or TakenRequest(len(message.gpus), message.units, 0.0)
        demand = _taken_demand(request, self._totals)
        r = _Req(message.req, demand, True, None, name=request.name, command=request.command)
        r.asked = (request.count, request.units, request.unit)
        r.state, r.id, r.gpus, r.units = _State.HELD, message.id, message.gpus, message.units
        r.since = time.monotonic() - request.age_s
        self._reqs[r.key] = r
        self._granted += 1
        call.reply = message
        self._to_wake.append(call)

    def _on_given(self, message: Given) -> None:
        """The lease a ``give`` offered may now be taken: forget it at once (this backend
        never releases or re-declares it again)."""
        call = self._calls.pop(message.req, None)
        if call is None:
            return
        r = None if call.giving is None else self._reqs.get(call.giving)
        if r is not None and r.id == message.id:
            del self._reqs[r.key]
            self._handed[r.key] = message.id
            self._released += 1  # no longer held here: granted - released stays what is held
        call.reply = message
        self._to_wake.append(call)

    def _on_error(self, message: ErrorReply) -> None:
        if message.req is None:
            _log.info("hwpool: the server on %s says: %s", self._path, message.message)
            return
        call = self._calls.pop(message.req, None)
        if call is not None:
            if isinstance(call.message, Give | Take):
                call.error = self._handover_error(call.message, message)
            else:
                call.error = ConnectionError(message.message)
            self._to_wake.append(call)
        r = self._reqs.pop(message.req, None)
        if r is None:
            return
        if r.state is _State.HELD:  # a reclaim the new server could not take
            self._orphans.add(r.key)
            self._released += 1
            _log.warning(
                "hwpool: lease #%s on GPUs %s is lost after a server restart: %s",
                r.id, list(r.gpus), message.message,
            )  # fmt: skip
            return
        r.error = _error_for(message)
        self._to_wake.append(r)

    def _on_revoked(self, message: Revoked) -> None:
        r = self._reqs.get(message.req)
        if r is None:
            return
        if message.reason == "overuse":  # known before the lease reads as not held
            self._overuse_keys.add(r.key)
        del self._reqs[message.req]
        self._orphans.add(r.key)
        self._released += 1
        if message.reason == "overuse":
            _log.warning(
                "hwpool: lease #%s on GPUs %s was ended for overuse: its processes used more GPU "
                "memory than it was leased; its release is a no-op",
                message.id, list(r.gpus),
            )  # fmt: skip
            return
        if message.reason == "limit":
            self._revoked_count += 1
            self._timed_out_keys.add(r.key)
            _log.info(
                "hwpool: lease #%s on GPUs %s was revoked: its time limit (%g s) ran out; its "
                "release is a no-op",
                message.id, list(r.gpus), r.demand.limit or 0.0,
            )  # fmt: skip
            return
        _log.warning(
            "hwpool: lease #%s on GPUs %s was revoked by %s (hwpool cancel): the server may "
            "grant those GPUs to others now, and its release is a no-op",
            message.id, list(r.gpus), _user(message.by),
        )  # fmt: skip

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

    def _asked(self, demand: Demand) -> tuple[int, int, Unit]:
        """``count``, ``units`` and ``unit`` of the request for ``demand``."""
        return request_for(demand, self._totals is not None, UNITS_PER_GPU)

    def _held(self, r: _Req) -> tuple[tuple[int, int], ...]:
        """``(gpu, units)`` that ``r`` holds on each of its GPUs (whole ones: the total)."""
        if r.units or self._totals is None:
            return tuple((g, r.units) for g in r.gpus)
        return tuple((g, self._totals[g]) for g in r.gpus)

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

    def _abandon(self, r: _Req, *, timed_out: bool, lost: bool = False) -> None:
        """The waiter gave up (may run in a finalizer): withdraw, or give back a late grant.

        ``lost``: its grant could not be delivered (its loop closed); not counted as cancelled.
        """

        def op() -> None:
            if self._reqs.get(r.key) is not r:
                return
            del self._reqs[r.key]
            if r.state is _State.HELD:
                self._released += 1
            if timed_out:
                self._timed_out += 1
            elif not lost:
                self._cancelled += 1
            self._post(Withdraw(next(self._keys), r.key, timed_out=timed_out))

        self._defer(op)

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

    # ----------------------------------------------------------------- hand-over
    def give(self, grant: Grant) -> str:
        """Offer ``grant``'s lease to another connection of this user; its ticket (a secret:
        pass it only to the process that is to take the lease, with its id, ``lease_id``).

        Once this returns, this backend has forgotten the grant: it never releases it (its
        ``release`` raises ValueError naming it as handed over), nor re-declares it after a
        reconnect. The server keeps the lease on this backend's connection until it is taken
        (``take``), and frees it if that connection closes first (``close()``, exit), or a
        restart of the server comes first (a ticket does not survive one). Giving it again
        (before it was taken) is not possible here: it is forgotten.

        ValueError, changing nothing, for a grant this backend does not hold whole (released,
        revoked, partly released, handed over already) or that the server refuses;
        ConnectionError if the server does not answer, or knows no hand-over (older).
        """
        r = self._reqs.get(grant.ticket)
        if r is None or r.state is not _State.HELD or r.id is None:
            if grant.ticket in self._handed:
                raise ValueError(
                    f"grant {grant.ticket} (lease #{self._handed[grant.ticket]}) was handed "
                    "over already"
                )
            raise ValueError(
                f"grant {grant.ticket} (GPU(s) {list(grant.gpus)}) is not held by this pool: "
                "released, revoked or lost already, or never granted here"
            )
        if sorted(grant.gpus) != sorted(r.gpus) or grant.units != r.units:
            raise ValueError(
                f"grant {grant.ticket} names GPU(s) {list(grant.gpus)} of {grant.units} units, "
                f"but lease #{r.id} holds GPU(s) {list(r.gpus)} of {r.units} units: only a "
                "whole lease can be handed over"
            )
        reply = self._call(lambda key: Give(key, r.id or 0), giving=r.key)
        assert isinstance(reply, Given)
        return reply.ticket

    def take(
        self, lease_id: int, ticket: str, *, name: str | None = None, command: str | None = None
    ) -> Grant:
        """Become the holder of lease ``lease_id``, given (``give``) by a connection of this
        user with ``ticket``: its grant, this backend's like any other from now on (released by
        ``release``, re-declared after a reconnect, revoked at its time limit, which stays the
        one it had). ``name`` and ``command`` relabel it in ``hwpool status`` (None: this
        backend's labels, else the lease's own).

        TypeError or ValueError naming the argument for a bad ``lease_id`` or ``ticket``;
        ValueError when the server refuses (no such lease offered to this user with this
        ticket: wrong, used, its giver gone); ConnectionError if the server does not answer.
        """
        ident = check_int("lease_id", lease_id, minimum=1)
        if not isinstance(ticket, str) or not TICKET.fullmatch(ticket):
            raise ValueError(
                f"ticket must be what give() returned (16 to 64 letters, digits, '_' or '-'), "
                f"got {ticket!r:.80}"
            )
        label = self._name if name is None else _label("name", name)
        text = self._command if command is None else _label("command", command)
        reply = self._call(lambda key: Take(key, ident, ticket, label, text))
        assert isinstance(reply, Granted)
        return Grant(reply.req, reply.gpus, reply.units)

    def _call(
        self, ask: Callable[[int], ClientMessage], *, giving: int | None = None
    ) -> ServerMessage:
        """One round trip for a hand-over: ``ask(key)`` sent, its answer awaited (bounded)."""
        self._connected()
        with self._section():
            key = next(self._keys)
            message = ask(key)
            call = self._calls[key] = _Call(message, giving)
            self._send_or_connect(message)
        if not _wait(call, REPLY_TIMEOUT_S):
            with self._section():
                self._calls.pop(key, None)  # a take answered later is given back then
            raise ConnectionError(
                f"no answer to {message.op} from the hwpool server on {str(self._path)!r}"
            )
        if call.error is not None:
            raise call.error
        assert call.reply is not None
        return call.reply

    def _handover_error(self, asked: Give | Take, reply: ErrorReply) -> BaseException:
        """The error a ``give`` or ``take`` refused with ``reply`` raises."""
        if reply.code is ErrorCode.UNKNOWN_OP:
            return ConnectionError(
                f"the hwpool server on {str(self._path)!r} knows no lease hand-over ({asked.op}):"
                " it is older than this hwpool; upgrade it"
            )
        if reply.code in (ErrorCode.NOT_FOUND, ErrorCode.FORBIDDEN, ErrorCode.BAD_MESSAGE):
            return ValueError(f"the hwpool server refused the {asked.op}: {reply.message}")
        return ConnectionError(f"the hwpool server refused the {asked.op}: {reply.message}")

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


def _token() -> threading.Lock:
    """A wake-up token for one thread waiter: held (no token) until the reader gives it."""
    lock = threading.Lock()
    lock.acquire()
    return lock


def _wait(item: _Req | _Call, timeout: float | None) -> bool:
    """Wait until ``item`` is answered or ``timeout`` passes; whether it was answered.

    On the main thread the wait is cut in slices of SIGNAL_SLICE_S: CPython acts on a signal
    only between two bytecodes, so a SIGINT that lands as the thread goes to sleep (or on
    another thread) would otherwise wait for the end of the sleep, which without a timeout
    never comes (``hwpool run`` hung after Ctrl-C so). The truth is ``item.answered``, never
    the token: an exception may land just after the token was taken, and the next wait looks
    again. No Condition is involved, whose Python-level wait an exception can cut in half.
    """
    wake = item.wake
    assert wake is not None
    main = get_ident() == threading.main_thread().ident
    deadline = None if timeout is None else time.monotonic() + timeout
    while not item.answered:
        if deadline is None:
            wake.acquire(True, SIGNAL_SLICE_S if main else -1)
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        wake.acquire(True, min(left, SIGNAL_SLICE_S) if main else left)
    return True


class _Incompatible(ConnectionError):
    """A server answered, but what this process holds cannot be declared to it."""


def _user(uid: int) -> str:
    """``alice (uid 1000)``, or ``uid 1000`` for a uid no user has (escaped: for the log)."""
    try:
        return f"{printable(pwd.getpwuid(uid).pw_name)} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _label(what: str, text: str | None) -> str | None:
    if text is not None and not isinstance(text, str):
        raise TypeError(f"{what} must be a string or None, got {text!r}")
    if text is not None and len(text) > MAX_TEXT:
        raise ValueError(f"{what} must be at most {MAX_TEXT} characters, got {len(text)}")
    if text is not None and not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:  # no line could carry it to the server
            raise ValueError(
                f"{what} must be text UTF-8 can carry, got {printable(text)!r} (it holds a "
                "lone surrogate, such as an undecodable byte of a file name)"
            ) from None
    return text


def _taken_demand(request: TakenRequest, totals: tuple[int, ...] | None) -> Demand:
    """The demand of a lease taken over, from what its ``acquire`` asked (``request``), as a
    GPUPool of this server (``totals``: sized in memory) would have made it."""
    if request.unit == "mib":
        return make_demand(memory=request.units, totals=totals, limit=request.limit_s)
    return make_demand(
        count=request.count, units=request.units, totals=totals,
        limit=request.limit_s, keep_shares=True,
    )  # fmt: skip


def _error_for(message: ErrorReply) -> BaseException:
    if message.code is ErrorCode.CANCELLED:
        return RevokedError(message.message)
    if message.code is ErrorCode.BAD_REQUEST:
        return ValueError(message.message)
    return ConnectionError(f"the hwpool server refused the request: {message.message}")


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


def _read(ref: weakref.ref[UnixBackend], wire: Wire | None) -> None:
    """The connection thread: connect when it has no connection (``wire`` None), then read
    and dispatch each message; on a lost connection, let the backend reconnect or stop.

    It holds the backend only while handling a message or connecting, so an unused backend
    can be collected (its connection then closes and the server frees what it held).
    """
    while True:
        if wire is None:
            backend = ref()
            wire = None if backend is None else backend._reconnect()
            del backend
            if wire is None:
                return
        try:
            messages = wire.read_batch()
        except ConnectionError as exc:
            backend = ref()
            again = backend is not None and backend._lost(wire, exc)
            del backend
            if not again:
                return
            wire = None
            continue
        backend = ref()
        if backend is None:
            wire.shutdown()
            return
        backend._dispatch(messages)
        del backend
