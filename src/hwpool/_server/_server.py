"""``hwpool serve``: the asyncio server that puts one scheduler core behind a Unix socket.

One event-loop thread owns the :class:`HostState` (and through it the core), so nothing is
locked. Each connection is an ``asyncio.Protocol``: bytes become lines (``LineBuffer``),
lines become validated messages, messages become calls on the state, and the deliveries it
returns are written to their connections. A connection that closes, for any reason, takes
its leases and waiters with it. Whatever a client sends, the server answers with an error
and, for what cannot go on (bad framing, no hello), closes that one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .._host._detect import GPUInfo
from .._version import __version__
from .._wire._paths import start_lock_path
from .._wire._protocol import (
    PROTOCOL_VERSION,
    Acquire,
    Bye,
    Cancel,
    ClientMessage,
    Done,
    ErrorCode,
    Hello,
    LineBuffer,
    ProtocolError,
    Reclaim,
    Reclaimed,
    Release,
    ServerMessage,
    Status,
    Welcome,
    Withdraw,
    decode_client,
    encode,
)
from . import _journal
from ._host_state import Client, Delivery, HostState
from ._listen import Peer, ServeError, admitted, bind, hold_lock, peer_of, prepare_directory

__all__ = ["ServeConfig", "ServeError", "serve"]

MAX_BUFFERED = 4 * 1024 * 1024  # bytes queued to a client that does not read: then it goes


@dataclass(frozen=True)
class ServeConfig:
    """What ``hwpool serve`` was asked for; see the command's options."""

    socket: Path
    gpus: tuple[GPUInfo, ...]
    group: int | None = None
    grace_s: float = 5.0
    hello_timeout_s: float = 10.0
    max_connections: int = 64  # per uid
    journal_delay_s: float = 0.05
    idle_timeout_s: float | None = None  # stop after this long with no connection (None: never)
    policy: str = "easy"  # the core's scheduling policy
    totals: tuple[int, ...] | None = None  # MiB shared out per GPU (None: fractions)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Connection(asyncio.Protocol):
    """One client connection: framing, the hello exchange and the idle timers."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = Peer(0, -1, -1)
        self.client: Client | None = None
        self.buffer = LineBuffer()
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False
        self.closed = False

    # ----------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self.peer = peer_of(sock) if sock is not None else self.peer
        refusal = self.server.admit(self)
        if refusal is not None:
            self.fail(ProtocolError(ErrorCode.REFUSED, refusal))
            return
        self.arm_timer()

    def data_received(self, data: bytes) -> None:
        try:
            lines = self.buffer.feed(data)
        except ProtocolError as exc:
            self.fail(exc)
            return
        for line in lines:
            if self.closed:
                return
            self.server.handle(self, line)
        if not self.closed:
            self.arm_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        self.server.forget(self)

    # ----------------------------------------------------------------- helpers
    def arm_timer(self) -> None:
        """Before hello, or while half a line waits, the peer has hello_timeout_s to go on."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.client is None or self.buffer.partial:
            delay = self.server.config.hello_timeout_s
            self.timer = asyncio.get_running_loop().call_later(delay, self.timed_out)

    def timed_out(self) -> None:
        what = "no hello" if self.client is None else "half a message"
        delay = self.server.config.hello_timeout_s
        self.fail(ProtocolError(ErrorCode.TIMEOUT, f"{what} after {delay:g} s"))

    def send(self, message: ServerMessage) -> None:
        if self.closed or self.transport is None:
            return
        self.transport.write(encode(message))
        if self.transport.get_write_buffer_size() > MAX_BUFFERED:
            self.server.say(f"dropping {self.describe()}: it does not read its replies")
            self.closed = True
            self.transport.abort()

    def fail(self, error: ProtocolError) -> None:
        """Report ``error``; close the connection if it is fatal."""
        self.send(error.reply())
        if error.code.fatal and not self.closed:
            self.server.say(f"closing {self.describe()}: {error.code}: {error.message}")
            self.closed = True
            assert self.transport is not None
            self.transport.close()  # after the error reply is flushed

    def describe(self) -> str:
        return f"connection of uid {self.peer.uid} pid {self.peer.pid}"


class _Server:
    """The state, the connections and the journal writer of one running server."""

    def __init__(self, config: ServeConfig, out: TextIO) -> None:
        self.config = config
        self.out = out
        self.uid = os.getuid()
        self.started = time.monotonic()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._log: list[str] = []
        self._stamp_second, self._stamp = -1, ""
        self.state = HostState(
            len(config.gpus), totals=config.totals, mig=any(g.is_mig for g in config.gpus),
            admins={0, self.uid}, log=self.say, policy=config.policy,
        )  # fmt: skip
        self.journal_path = _journal.journal_path(config.socket)
        self.by_client: dict[Client, _Connection] = {}
        self.per_uid: dict[int, int] = {}
        self.numbers = 0
        self.writer = _journal.JournalWriter(self.journal_path, os.getpid(), self.say)
        self.journaled_limit = 0  # the id limit of the last journal known to be on disk
        self.journal_timer: asyncio.TimerHandle | None = None
        self.recovery_timer: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.stop: asyncio.Event | None = None
        self.start_lock: int | None = None  # held from an idle stop until the process exits

    def say(self, line: str) -> None:
        """Log one line. From the loop thread, lines are written together once per turn of
        the loop (one write, not one per grant); from elsewhere, at once."""
        second = int(time.time())
        if second != self._stamp_second:
            self._stamp_second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        self._log.append(f"{self._stamp} hwpool serve: {line}\n")
        if self.loop is None or threading.get_ident() != self._loop_thread:
            self.flush_log()
        elif len(self._log) == 1:
            self.loop.call_soon(self.flush_log)

    def flush_log(self) -> None:
        lines, self._log = self._log, []
        with contextlib.suppress(OSError, ValueError):  # a closed log must not stop the server
            self.out.write("".join(lines))
            self.out.flush()

    # ----------------------------------------------------------------- connections
    def admit(self, conn: _Connection) -> str | None:
        """Count ``conn`` against its uid, or say why it is refused."""
        peer = conn.peer
        if not admitted(peer, self.uid, self.config.group):
            return (
                f"uid {peer.uid} may not use this server (it serves uid {self.uid}"
                + ("" if self.config.group is None else f" and group {self.config.group}")
                + "); start one of your own, or ask for a machine-wide one with --group"
            )
        if self.per_uid.get(peer.uid, 0) >= self.config.max_connections:
            return f"uid {peer.uid} already has {self.config.max_connections} connections"
        self.per_uid[peer.uid] = self.per_uid.get(peer.uid, 0) + 1
        conn.counted = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        return None

    def forget(self, conn: _Connection) -> None:
        if conn.counted:
            conn.counted = False
            self.per_uid[conn.peer.uid] -= 1
            if not self.per_uid[conn.peer.uid]:
                del self.per_uid[conn.peer.uid]
            self.arm_idle()
        if conn.client is not None:
            self.by_client.pop(conn.client, None)
            self.after(self.state.disconnect(conn.client, time.monotonic()))

    def welcome(self, conn: _Connection, hello: Hello) -> None:
        if hello.version != PROTOCOL_VERSION:
            text = f"protocol version {hello.version} is not {PROTOCOL_VERSION} ({__version__})"
            conn.fail(ProtocolError(ErrorCode.VERSION, text))
            return
        self.numbers += 1
        conn.client = Client(self.numbers, conn.peer.uid, conn.peer.pid)
        self.by_client[conn.client] = conn
        conn.send(
            Welcome(
                PROTOCOL_VERSION, f"hwpool {__version__}", os.getpid(), self.uid,
                self.state.units_per_gpu, self.config.gpus, self.state.recovery is not None,
                self.state.totals,
            )
        )  # fmt: skip

    # ----------------------------------------------------------------- messages
    def handle(self, conn: _Connection, line: bytes) -> None:
        """Serve one line of ``conn``; no message can raise past this."""
        try:
            message = decode_client(line)
            if conn.client is None or isinstance(message, Hello):
                if conn.client is not None or not isinstance(message, Hello):
                    raise ProtocolError(ErrorCode.HELLO_FIRST, "hello comes first, and once")
                self.welcome(conn, message)
                return
            if isinstance(message, Bye):
                self.goodbye(conn, conn.client, message)
                return
            deliveries = self.dispatch(conn.client, message, time.monotonic())
        except ProtocolError as exc:
            conn.fail(exc)
            return
        except Exception:  # a bug of ours: this connection goes, the server stays
            self.say("internal error:\n" + traceback.format_exc().rstrip())
            conn.fail(ProtocolError(ErrorCode.INTERNAL, "internal server error"))
            return
        self.after(deliveries)

    def goodbye(self, conn: _Connection, client: Client, message: Bye) -> None:
        """Free everything of ``client``, say so, then close (its ``close()`` waits for this)."""
        self.after([(client, Done(message.req)), *self.state.disconnect(client, time.monotonic())])
        del self.by_client[client]
        conn.client = None  # connection_lost has nothing left to free
        conn.closed = True
        assert conn.transport is not None
        conn.transport.close()

    def dispatch(self, client: Client, message: ClientMessage, now: float) -> list[Delivery]:
        state = self.state
        match message:
            case Acquire():
                return state.acquire(client, message, now)
            case Withdraw():
                return state.withdraw(client, message, now)
            case Release():
                return state.release(client, message, now)
            case Cancel():
                return state.cancel(client, message, now)
            case Reclaim():
                return state.reclaim(client, message, now)
            case Reclaimed():
                return state.reclaimed(client, now)
            case Status():  # answered once the journal is up to date: status is a sync point
                if state.changes != self.writer.written:
                    self.write_journal(wait=True)
                return [(client, state.status(message.req, now, self.started))]
        raise ProtocolError(ErrorCode.HELLO_FIRST, "hello comes first, and once")

    def after(self, deliveries: list[Delivery]) -> None:
        """Journal what must be journaled first, then send ``deliveries``."""
        if self.state.id_limit > self.journaled_limit:
            self.write_journal(wait=True)  # a new block of ids is on disk before anyone sees one
        elif self.state.changes != self.writer.submitted and self.journal_timer is None:
            loop = asyncio.get_running_loop()
            self.journal_timer = loop.call_later(self.config.journal_delay_s, self.write_journal)
        for client, message in deliveries:
            conn = self.by_client.get(client)
            if conn is not None:
                conn.send(message)

    def write_journal(self, *, wait: bool = False) -> None:
        """Hand the journal to the writer thread; with ``wait``, until it is on disk."""
        if self.journal_timer is not None:
            self.journal_timer.cancel()
            self.journal_timer = None
        journal, version = self.state.journal(), self.state.changes
        self.writer.submit(version, journal)
        if wait and self.writer.wait(version):
            self.journaled_limit = journal.id_limit

    # ----------------------------------------------------------------- recovery
    def recover(self) -> None:
        """Load the journal a previous server left and start the grace period if needed."""
        now = time.monotonic()
        try:
            journal = _journal.load(self.journal_path)
        except _journal.JournalError as exc:
            self.say(f"{exc}; holding grants back for the whole grace period")
            self.state.start_recovery(
                _journal.Journal(1), now, self.config.grace_s, _alive, complete=False
            )
        else:
            if journal is None:
                return
            if not journal.entries:
                self.state.next_id = self.state.id_limit = journal.id_limit
                return
            self.state.start_recovery(journal, now, self.config.grace_s, _alive)
        self.check_recovery()

    def check_recovery(self) -> None:
        """End recovery when due (pids may have died since); else look again shortly."""
        self.recovery_timer = None
        self.after(self.state.check_recovery(time.monotonic(), _alive))
        recovery = self.state.recovery
        if recovery is not None:
            delay = min(0.1, max(0.0, recovery.deadline - time.monotonic()))
            loop = asyncio.get_running_loop()
            self.recovery_timer = loop.call_later(delay, self.check_recovery)

    # ----------------------------------------------------------------- idle stop
    def arm_idle(self, delay: float | None = None) -> None:
        """With ``idle_timeout_s`` set and no connection left, stop once it has passed."""
        timeout = self.config.idle_timeout_s
        if timeout is None or self.per_uid or self.loop is None or self.idle_timer is not None:
            return
        self.idle_timer = self.loop.call_later(timeout if delay is None else delay, self.idle)

    def idle(self) -> None:
        """Stop if still idle. A client that is starting a server, or connecting to this one
        through the start lock, holds that lock: then look again shortly. The lock is kept
        until the process exits (after the server lock), so the next server can start."""
        self.idle_timer = None
        if self.per_uid or self.state.recovery is not None or self.stop is None:
            self.arm_idle(0.1 if self.state.recovery is not None else None)
            return
        fd = os.open(
            start_lock_path(self.config.socket), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            self.arm_idle(0.05)
            return
        self.start_lock = fd
        self.say(f"no client for {self.config.idle_timeout_s:g} s: stopping")
        self.stop.set()

    # ----------------------------------------------------------------- running
    async def run(self, sock: socket.socket) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        stop = self.stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        self.recover()
        self.write_journal(wait=True)
        server = await loop.create_unix_server(lambda: _Connection(self), sock=sock)
        self.say(
            f"serving {len(self.config.gpus)} GPU{'' if len(self.config.gpus) == 1 else 's'} "
            f"on {str(self.config.socket)!r} "
            f"(pid {os.getpid()}, uid {self.uid}"
            + ("" if self.config.group is None else f", group {self.config.group}")
            + ")"
        )
        self.arm_idle()
        try:
            await stop.wait()
        finally:
            server.close()
            for conn in list(self.by_client.values()):
                conn.fail(ProtocolError(ErrorCode.SHUTTING_DOWN, "the server is stopping"))
            self.write_journal(wait=True)  # kept: a restarted server lets the clients reclaim
            self.writer.stop()
            self.config.socket.unlink(missing_ok=True)
            self.loop = None
            self.say("stopped")


def serve(config: ServeConfig, out: TextIO | None = None) -> None:
    """Run the server until SIGTERM or SIGINT; ServeError if it cannot start."""
    prepare_directory(config.socket.parent, config.group)
    lock = hold_lock(config.socket)
    server: _Server | None = None
    try:
        sock = bind(config.socket, config.group)
        server = _Server(config, sys.stderr if out is None else out)
        asyncio.run(server.run(sock))
    finally:
        os.close(lock)
        if server is not None and server.start_lock is not None:
            os.close(server.start_lock)  # after the server lock: a new server can take that
