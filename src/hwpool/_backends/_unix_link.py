"""The unix backend's connection: its state, sections, outbox, wake-ups and reader thread.

- **Locking**: state is changed in *sections* (the lock, with its owner noted). What may run
  in a finalizer (a release, an abandoned waiter, a delivery a closed loop dropped) never
  waits for a section of its own thread: it is queued and run when that section ends.
  Messages are queued in an outbox under the lock and sent after it, so the reader thread
  never waits for a sender.
- **Waking**: a thread waiter through its own token, the waiters of one event loop through
  one ``call_soon_threadsafe`` for all of them.
- **Fork**: the child forgets the parent's connection and requests (their releases become
  no-ops there) and opens its own connection on first use.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from threading import get_ident

from .._check import check_timeout
from .._core._capacity import UNITS_PER_GPU
from .._core._scheduler import Demand
from .._errors import PoolClosedError
from .._host._detect import GPUInfo
from .._wire._connection import Wire
from .._wire._paths import client_socket
from .._wire._protocol import ClientMessage, ServerMessage, Unit, Withdraw, encode, request_for
from ._unix_requests import DIAL_TIMEOUT_S, _Call, _Incompatible, _label, _Req, _State


class _Delivery:
    """Resolves the futures of waiters of one loop, answered together (one hand-over to that
    loop, however many answers one read brought); if the loop drops it unrun, gives their
    grants back."""

    __slots__ = ("backend", "reqs")

    def __init__(self, backend: _UnixLink, reqs: list[_Req]) -> None:
        self.backend: _UnixLink | None = backend
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


_BACKENDS: weakref.WeakSet[_UnixLink] = weakref.WeakSet()


def _forget_parents() -> None:
    for backend in list(_BACKENDS):
        backend._after_fork()


os.register_at_fork(after_in_child=_forget_parents)


class _UnixLink:
    """The unix backend's state and its one connection: sections (the lock, and what runs
    when it is let go), the outbox, waking waiters, dialing, and the connection thread.

    The parts above it (``_unix_reconnect``, ``_unix_handover``, ``_unix_replies``,
    ``UnixBackend``) add what the connection thread does with what it reads, and the
    requests themselves.
    """

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

    # ----------------------------------------------------------------- requests
    def _asked(self, demand: Demand) -> tuple[int, int, Unit]:
        """``count``, ``units`` and ``unit`` of the request for ``demand``."""
        return request_for(demand, self._totals is not None, UNITS_PER_GPU)

    def _held(self, r: _Req) -> tuple[tuple[int, int], ...]:
        """``(gpu, units)`` that ``r`` holds on each of its GPUs (whole ones: the total)."""
        if r.units or self._totals is None:
            return tuple((g, r.units) for g in r.gpus)
        return tuple((g, self._totals[g]) for g in r.gpus)

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

    # ----------------------------------------------------------------- the parts above
    def _lost(self, wire: Wire, reason: ConnectionError) -> bool:
        """The reader lost ``wire``: whether to connect again (see ``_unix_reconnect``)."""
        raise NotImplementedError

    def _reconnect(self) -> Wire | None:
        """With no connection: a new one, everything re-declared (see ``_unix_reconnect``)."""
        raise NotImplementedError

    def _dispatch(self, messages: list[ServerMessage]) -> None:
        """Apply what one read brought (see ``_unix_replies``)."""
        raise NotImplementedError


def _read(ref: weakref.ref[_UnixLink], wire: Wire | None) -> None:
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
