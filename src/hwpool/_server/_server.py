"""``hwpool serve``: the asyncio server that puts one scheduler core behind a Unix socket.

One event-loop thread owns the :class:`HostState` (and through it the core), so nothing is
locked. Each connection is an ``asyncio.Protocol``: bytes become lines (``LineBuffer``),
lines become validated messages, messages become calls on the state, and the deliveries it
returns are written to their connections: write-ahead, once per turn of the loop the changes
of that turn are appended to the journal, and only then are its replies sent (while the
journal cannot be written, they wait, and the server says so in its log and its status). A
connection that closes, for any reason, takes its leases and waiters with it (except when the
server itself is stopping: then they stay journaled, for the clients to reclaim). Whatever a
client sends, the server answers with an error and, for what cannot go on (bad framing, no
hello), closes that one connection.
"""

from __future__ import annotations

import asyncio
import collections
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
from collections.abc import Iterable
from dataclasses import dataclass, replace
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
    StatusReply,
    Welcome,
    Withdraw,
    decode_client,
    encode,
)
from . import _journal
from ._host_state import Client, Delivery, HostState
from ._journal import JournalEntry
from ._listen import Peer, ServeError, admitted, bind, hold_lock, peer_of, prepare_directory

__all__ = ["ServeConfig", "ServeError", "serve"]

MAX_BUFFERED = 4 * 1024 * 1024  # bytes queued to a client that does not read: then it goes
LINES_PER_TURN = 16  # lines of one connection served per turn of the loop
RETRY_S = (0.05, 1.0)  # a journal that cannot be written is tried again after 50 ms .. 1 s


@dataclass(frozen=True)
class ServeConfig:
    """What ``hwpool serve`` was asked for; see the command's options."""

    socket: Path
    gpus: tuple[GPUInfo, ...]
    group: int | None = None
    grace_s: float = 5.0
    hello_timeout_s: float = 10.0
    max_connections: int = 64  # per uid
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
        self.ending = False  # it said bye: nothing more is read, the reply is on its way
        self.lines: collections.deque[bytes] = collections.deque()  # received, not served yet
        self.draining = False  # lines wait for the next turn of the loop; reading is paused

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
        self.lines.extend(lines)
        if not self.draining:
            self.drain()

    def drain(self) -> None:
        """Serve up to LINES_PER_TURN lines, then let the loop serve the others: one client
        writing thousands of requests at once does not stall anyone else's round trip (its
        socket is not read meanwhile, so what it sends waits in the kernel, not here)."""
        lines = self.lines
        for _ in range(min(len(lines), LINES_PER_TURN)):
            if self.closed or self.ending:
                lines.clear()
                break
            self.server.handle(self, lines.popleft())
        assert self.transport is not None
        if lines and not self.closed:
            if not self.draining:
                self.draining = True
                self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self.drain)
            return
        if self.draining:
            self.draining = False
            if not self.closed and not self.transport.is_closing():
                self.transport.resume_reading()
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
        self.ids_path = _journal.ids_path(config.socket)
        self.journal: _journal.JournalFile | None = None  # opened once recovered
        self.outbox: list[tuple[_Connection, ServerMessage | None]] = []  # None: close it
        self.unwritten: dict[int, JournalEntry | None] = {}  # changes not on disk yet
        self.flush_handle: asyncio.Handle | None = None
        self.journal_error: str | None = None
        self.journal_failed_at = 0.0
        self.retry_s = RETRY_S[0]
        self.recovered_ids: set[int] = set()  # journaled by the previous server, until recovered
        self.pending_seen = -1  # how many of them recovery still expected at the last write
        self.stopping = False
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
            if not self.stopping:  # stopping: its requests stay journaled, to be reclaimed
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
        freed = self.state.disconnect(client, time.monotonic())
        self.outbox += [(conn, Done(message.req)), (conn, None)]
        del self.by_client[client]
        conn.client = None  # connection_lost has nothing left to free
        conn.ending = True
        self.after(freed)

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
            case Status():  # sent after this turn's journal records, like every reply
                reply = state.status(message.req, now, self.started)
                return [(client, replace(reply, journal_error=self.journal_error))]
        raise ProtocolError(ErrorCode.HELLO_FIRST, "hello comes first, and once")

    def after(self, deliveries: list[Delivery]) -> None:
        """Send ``deliveries`` once this turn's changes are journaled (write-ahead)."""
        by_client = self.by_client
        for client, message in deliveries:
            conn = by_client.get(client)
            if conn is not None:
                self.outbox.append((conn, message))
        if self.flush_handle is None and self.loop is not None and not self.stopping:
            self.flush_handle = self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Journal the changes of this turn of the loop, then send its replies.

        If the journal cannot be written, the replies wait (status replies excepted, so that
        ``hwpool status`` can say why) and the write is tried again shortly: no grant is
        ever seen that a restarted server would not know about.
        """
        if self.flush_handle is not None:
            self.flush_handle.cancel()  # (a no-op when this is that call)
            self.flush_handle = None
        if self.write_journal():
            outbox, self.outbox = self.outbox, []
        else:
            outbox = [x for x in self.outbox if isinstance(x[1], StatusReply)]
            self.outbox = [x for x in self.outbox if not isinstance(x[1], StatusReply)]
        for conn, message in outbox:
            if message is not None:
                conn.send(message)
            elif not conn.closed and conn.transport is not None:
                conn.closed = True
                conn.transport.close()  # after its last reply is flushed

    def write_journal(self) -> bool:
        """Append what changed to the journal; whether it is all on disk now."""
        assert self.journal is not None
        state = self.state
        self.unwritten.update(state.journal_changes())
        if self.recovered_ids:
            self.journal_recovered()
        try:
            self.journal.write(state.id_limit, self.unwritten, state.counters())
        except OSError as exc:
            self.journal_failed(f"cannot write the journal {str(self.journal_path)!r}: "
                                f"{exc.strerror or exc}")  # fmt: skip
            return False
        self.unwritten = {}
        if self.journal_error is not None:
            held = sum(m is not None for _, m in self.outbox)
            down = time.monotonic() - self.journal_failed_at
            self.say(f"the journal is written again after {down:.1f} s: {held} held replies go out")
            self.journal_error, self.retry_s = None, RETRY_S[0]
        return True

    def journal_recovered(self) -> None:
        """Journal as gone what the previous server journaled and recovery no longer expects
        (reclaimed under another id, given up by its client, of a dead pid; at the end of
        recovery, all that was not reclaimed), so that a second crash does not wait for it."""
        state, recovery = self.state, self.state.recovery
        if recovery is not None and len(recovery.pending) == self.pending_seen:
            return
        expected = {} if recovery is None else recovery.pending
        gone = [
            i for i in self.recovered_ids
            if i not in expected and not state.has_id(i) and i not in self.unwritten
        ]  # fmt: skip
        assert self.journal is not None
        live = self.journal.live
        self.count_freed(live[i] for i in gone if i in live)
        self.unwritten.update(dict.fromkeys(gone))
        self.recovered_ids.difference_update(gone)
        self.pending_seen = len(expected)
        if recovery is None:
            self.recovered_ids = set()

    def count_freed(self, entries: Iterable[JournalEntry]) -> None:
        """Count what a previous server journaled and nobody reclaimed (now freed) as released
        leases and cancelled waiters, so that the counters add up across restarts."""
        for entry in entries:
            if entry.held is not None:
                self.state.released += 1
            else:
                self.state.cancelled += 1

    def journal_failed(self, error: str) -> None:
        """Say so (once per new error) and try again shortly."""
        if error != self.journal_error:
            self.say(f"{error}; nothing new is granted until it is written (trying again)")
            if self.journal_error is None:
                self.journal_failed_at = time.monotonic()
            self.journal_error = error
        if self.loop is not None and not self.stopping:
            self.flush_handle = self.loop.call_later(self.retry_s, self.flush)
            self.retry_s = min(RETRY_S[1], self.retry_s * 2)

    # ----------------------------------------------------------------- recovery
    def recover(self) -> None:
        """Load the journal a previous server left and start the grace period if needed;
        then open the journal for this server (its first write replaces the file)."""
        now = time.monotonic()
        ids_on_disk = self.load_id_limit()
        journal: _journal.Journal | None = None
        try:
            journal = _journal.load(self.journal_path)
        except _journal.JournalError as exc:
            self.say(f"{exc}; holding grants back for the whole grace period")
            self.state.start_recovery(
                _journal.Journal(1), now, self.config.grace_s, _alive, complete=False
            )
        if journal is not None:
            self.state.restore_counters(journal.counters)
            limit = max(self.state.id_limit, journal.id_limit)
            self.state.next_id = self.state.id_limit = limit
            if journal.entries:
                self.state.start_recovery(journal, now, self.config.grace_s, _alive)
        snapshot = self.state.journal()
        self.recovered_ids = {e.id for e in snapshot.entries}
        if journal is not None:  # what dead pids held is freed already
            self.count_freed(e for e in journal.entries if e.id not in self.recovered_ids)
        self.journal = _journal.JournalFile(
            self.journal_path, self.ids_path, os.getpid(), snapshot, ids_on_disk=ids_on_disk,
            log=self.say,
        )  # fmt: skip
        if self.state.recovery is not None:
            self.check_recovery()

    def load_id_limit(self) -> int:
        """Start ids at the limit of ``<socket>.ids`` (kept apart from the journal, so that
        no id is shown twice even if the journal is lost); the limit found there (0: none)."""
        try:
            limit = _journal.load_ids(self.ids_path)
        except _journal.JournalError as exc:
            self.say(f"{exc}; ids go on from the journal's limit")
            return 0
        if limit is not None:
            self.state.next_id = self.state.id_limit = max(self.state.id_limit, limit)
        return limit or 0

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
        self.flush()  # the journal starts anew from what was recovered
        server = await loop.create_unix_server(lambda: _Connection(self), sock=sock)
        self.say(
            f"serving {len(self.config.gpus)} GPUs on {str(self.config.socket)!r} "
            f"(pid {os.getpid()}, uid {self.uid}"
            + ("" if self.config.group is None else f", group {self.config.group}")
            + ")"
        )
        self.arm_idle()
        try:
            await stop.wait()
        finally:
            server.close()
            self.stop_serving()
            self.config.socket.unlink(missing_ok=True)
            self.loop = None
            self.say("stopped")

    def stop_serving(self) -> None:
        """Journal and send what this turn decided, then close every connection. What the
        clients hold stays journaled (their disconnections now change nothing), so that a
        restarted server lets them reclaim it."""
        self.flush()
        self.stopping = True
        if self.outbox:
            self.say(f"stopping with the journal unwritable: {len(self.outbox)} replies not sent")
            self.outbox = []
        for conn in list(self.by_client.values()):
            conn.fail(ProtocolError(ErrorCode.SHUTTING_DOWN, "the server is stopping"))
        assert self.journal is not None
        self.journal.close()


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
