"""``hwpool serve``: the asyncio server that puts one scheduler core behind a Unix socket.

One event-loop thread owns the :class:`HostState` (and through it the core), so nothing is
locked. Each connection is an ``asyncio.Protocol``: bytes become lines (``LineBuffer``),
lines become validated messages, messages become calls on the state, and the deliveries it
returns are written to their connections: write-ahead, once per turn of the loop the changes
of that turn are appended to the journal, and only then are its replies sent, those to one
connection in one write (while the journal cannot be written, they wait, and the server says
so in its log and its status). A connection that closes, for any reason, takes its leases and
waiters with it (except when the server itself is stopping: then they stay journaled, for the
clients to reclaim). Whatever a client sends, the server answers with an error and, for what
cannot go on (bad framing, no hello), closes that one connection.

What is written to a connection is never the reason it is dropped: a reply that cannot be
encoded becomes an ``error`` (``reply_failed``) for its request, and a status answer of any
length is streamed in lines as the client reads them (``pause_writing``/``resume_writing``),
computed when the connection's earlier replies are out. Only a client that leaves more than
``MAX_BUFFERED`` bytes unread is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import fcntl
import os
import pwd
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._limits import OwnerLimits
from .._host._detect import GPUInfo
from .._host._devices import memory_groups_of
from .._host._procs import ProcFS, process_start
from .._printable import printable
from .._version import __version__
from .._watch._proof import has_job
from .._wire._paths import start_lock_path
from .._wire._protocol import (
    PROTOCOL_VERSION,
    Acquire,
    Bye,
    Cancel,
    ClientMessage,
    Done,
    Drain,
    ErrorCode,
    ErrorReply,
    Give,
    Hello,
    LineBuffer,
    ProtocolError,
    Reclaim,
    Reclaimed,
    Release,
    ServerMessage,
    Status,
    StatusReply,
    Take,
    Welcome,
    Withdraw,
    decode_client,
    encode,
    status_lines,
)
from .._wire._safety import open_side_file
from . import _journal
from ._config import Owner, group_members
from ._defaults import (
    MAX_REQUESTS_PER_CONNECTION,
    MAX_REQUESTS_PER_USER,
    METRICS_MAX_CONNECTIONS,
    METRICS_TIMEOUT_S,
)
from ._drain_file import DrainFileError, drain_path, load_drained, save_drained
from ._host_entries import Client, Delivery
from ._host_state import HostState
from ._journal import JournalEntry
from ._listen import (
    Peer,
    ServeError,
    admitted,
    bind,
    hold_lock,
    peer_of,
    prepare_directory,
    refusal,
)
from ._watching import Watching, watch_refusal

if TYPE_CHECKING:
    from ._metrics import MetricsEndpoint

__all__ = ["ServeConfig", "ServeError", "serve"]

MAX_BUFFERED = 4 * 1024 * 1024  # bytes queued to a client that does not read: then it goes
STREAM_COST = 1024  # what a status answer not yet begun counts against MAX_BUFFERED
LINES_PER_TURN = 16  # lines of one connection served per turn of the loop
RETRY_S = (0.05, 1.0)  # a journal that cannot be written is tried again after 50 ms .. 1 s


@dataclass(frozen=True)
class ServeConfig:
    """What ``hwpool serve`` was asked for; see the command's options."""

    socket: Path
    gpus: tuple[GPUInfo, ...]
    group: int | None = None
    admin_group: int | None = None  # its members may act on anyone's requests, and drain
    grace_s: float = 5.0
    hello_timeout_s: float = 10.0
    max_connections: int = 64  # data connections per uid
    max_control_connections: int = 8  # per uid, beyond those: for status and cancel only
    max_requests_per_connection: int = MAX_REQUESTS_PER_CONNECTION  # leases and waiters
    max_requests_per_user: int = MAX_REQUESTS_PER_USER  # leases and waiters, per uid
    idle_timeout_s: float | None = None  # stop after this long with no connection (None: never)
    policy: str = "easy"  # the core's scheduling policy
    totals: tuple[int, ...] | None = None  # MiB shared out per GPU (None: fractions)
    shares: Mapping[Owner, float] = field(default_factory=dict)  # uid or account -> share
    half_life: float = DEFAULT_HALF_LIFE  # seconds: of usage, for the fair share
    limits: Mapping[Owner, OwnerLimits] = field(default_factory=dict)  # owner -> its limits
    default_limits: OwnerLimits | None = None  # every other owner's limits (None: none)
    accounts: Mapping[str, frozenset[int]] = field(default_factory=dict)  # name -> uids
    metrics_port: int | None = None  # serve Prometheus metrics there (None: no; 0: any port)
    metrics_host: str = "127.0.0.1"
    metrics_max_connections: int = METRICS_MAX_CONNECTIONS  # open at once; past it: closed
    metrics_timeout_s: float = METRICS_TIMEOUT_S  # for a request to arrive, and its answer
    watch_interval_s: float = 2.0  # seconds between samples of the GPUs (0: not watched)
    over_lease: str = "warn"  # a lease over its memory: warn, term or off
    over_lease_grace_s: float = 30.0  # with term: how long it may stay over
    over_lease_owners: Mapping[Owner, str] = field(default_factory=dict)  # owner -> policy
    left_out: tuple[tuple[str, str], ...] = ()  # GPUs detection could not read: (which, why)


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
        self.start: int | None = None  # the peer pid's start time, read when accepted
        self.client: Client | None = None
        self.buffer = LineBuffer()
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False
        self.role: str | None = None  # its hello's role, once welcomed
        self.closed = False  # nothing more is read or sent (what is queued still goes out)
        # What waits to be written, in order, while the transport is paused: encoded lines,
        # and status answers (generators run as their lines are written).
        self.backlog: collections.deque[bytes | Iterator[bytes]] = collections.deque()
        self.backlog_bytes = 0
        self.paused = False  # the transport's buffer is full: the client reads slowly
        self.closing = False  # close once the backlog is written
        self.next_flush: asyncio.Handle | None = None  # the next line of a status, next turn
        self.ending = False  # it said bye: nothing more is read, the reply is on its way
        self.lines: collections.deque[bytes] = collections.deque()  # received, not served yet
        self.draining = False  # lines wait for the next turn of the loop; reading is paused

    # ----------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self.peer = peer_of(sock) if sock is not None else self.peer
        self.start = process_start(self.peer.pid) if self.peer.pid > 0 else None
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
        self.backlog.clear()
        if self.next_flush is not None:
            self.next_flush.cancel()
        self.server.forget(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()

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
        """Write ``message`` (after what is queued before it); never raises, never drops the
        connection for what the message is: one that cannot be encoded is logged and becomes
        an ``error`` for its request."""
        if self.closed or self.transport is None:
            return
        self.put(self.encoded(message))

    def put_all(self, lines: list[bytes]) -> None:
        """Write encoded ``lines`` (replies of one turn of the loop) with one write: one
        ``send`` for all of them, and one read for the client."""
        if self.closed or self.transport is None:
            return
        self.put(lines[0] if len(lines) == 1 else b"".join(lines))

    def stream(self, lines: Iterator[bytes]) -> None:
        """Write the lines of ``lines`` as the client reads them (a status answer); the
        generator runs when everything queued before it is written."""
        if self.closed or self.transport is None:
            return
        self.backlog.append(lines)
        self.backlog_bytes += STREAM_COST
        self.flush()
        if self.backlog:  # not all written: the client reads slowly, or asks without reading
            self.check_unread()

    def put(self, line: bytes) -> None:
        """Write ``line`` now, or queue it behind what waits (in order)."""
        assert self.transport is not None
        if self.backlog or self.paused:
            self.backlog.append(line)
            self.backlog_bytes += len(line)
        else:
            self.transport.write(line)
        self.check_unread()

    def flush(self) -> None:
        """Write from the backlog until the transport's buffer is full or all is out, one
        line of a status answer per turn of the loop (other clients are served between)."""
        if self.next_flush is not None:
            self.next_flush.cancel()
            self.next_flush = None
        transport = self.transport
        while self.backlog and not self.paused and transport is not None:
            head = self.backlog[0]
            if isinstance(head, bytes):
                self.backlog.popleft()
                self.backlog_bytes -= len(head)
                transport.write(head)
                continue
            try:
                line = next(head, None)
            except Exception:  # a bug of ours: the answer ends, the connection goes on
                self.server.say("internal error:\n" + traceback.format_exc().rstrip())
                line = None
            if line is None:
                self.backlog.popleft()
                self.backlog_bytes -= STREAM_COST
                continue
            transport.write(line)
            if not self.paused:
                self.next_flush = asyncio.get_running_loop().call_soon(self.flush)
            return
        if not self.backlog and self.closing and transport is not None:
            transport.close()

    def check_unread(self) -> None:
        """Drop a client that leaves more than MAX_BUFFERED bytes unread."""
        assert self.transport is not None
        if self.transport.get_write_buffer_size() + self.backlog_bytes > MAX_BUFFERED:
            self.server.say(f"dropping {self.describe()}: it does not read its replies")
            self.closed = True
            self.backlog.clear()
            self.transport.abort()

    def encoded(self, message: ServerMessage) -> bytes:
        """``message`` as its line; a line that cannot be made (a bug: it is logged) becomes
        an ``error`` for the message's request instead."""
        try:
            return encode(message)
        except (ValueError, TypeError) as exc:  # over MAX_LINE, or text UTF-8 cannot carry
            self.server.say(
                f"cannot send a {message.op} message to {self.describe()}: "
                f"{printable(str(exc))}; it gets a reply_failed error instead"
            )
            req = getattr(message, "req", None)
            text = f"the server could not encode its {message.op} reply (it is in its log)"
            return encode(ErrorReply(req, ErrorCode.REPLY_FAILED, text))

    def fail(self, error: ProtocolError) -> None:
        """Report ``error``; close the connection if it is fatal (once the reply is out)."""
        self.send(error.reply())
        if error.code.fatal and not self.closed:
            self.server.say(f"closing {self.describe()}: {error.code}: {printable(error.message)}")
            self.close_when_sent()

    def close_when_sent(self) -> None:
        """Read and send nothing more; close once what is queued is written."""
        self.closed = True
        self.closing = True
        self.flush()

    def describe(self) -> str:
        return f"connection of {self.server.who(self.peer.uid)} pid {self.peer.pid}"


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
            memory_groups=memory_groups_of(config.gpus),
            admins=admins_of(self.uid, config.admin_group), log=self.say, policy=config.policy,
            max_per_connection=config.max_requests_per_connection,
            max_per_user=config.max_requests_per_user, shares=config.shares,
            half_life=config.half_life, limits=config.limits,
            default_limits=config.default_limits, accounts=config.accounts,
        )  # fmt: skip
        procs = ProcFS()
        self.state.job_runs = lambda client: has_job(client.holder, procs)
        self.journal_path = _journal.journal_path(config.socket)
        self.drain_path = drain_path(config.socket)
        self.load_drained()
        self.by_client: dict[Client, _Connection] = {}
        self.per_uid: dict[int, int] = {}  # connections, welcomed or not, per uid
        self.per_role: dict[tuple[int, str], int] = {}  # welcomed connections per uid and role
        self.numbers = 0
        self.ids_path = _journal.ids_path(config.socket)
        self.journal: _journal.JournalFile | None = None  # opened once recovered
        # Replies of this turn, sent once its changes are journaled. None: close it after what
        # comes before; an iterator: a status answer, streamed (it waits for nothing).
        self.outbox: list[tuple[_Connection, ServerMessage | Iterator[bytes] | None]] = []
        self.unwritten: dict[int, JournalEntry | None] = {}  # changes not on disk yet
        self.flush_handle: asyncio.Handle | None = None
        self.journal_error: str | None = None
        self.journal_failed_at = 0.0
        self.retry_s = RETRY_S[0]
        self.recovered_ids: set[int] = set()  # journaled by the previous server, until recovered
        self.pending_seen = -1  # how many of them recovery still expected at the last write
        self.stopping = False
        self.recovery_timer: asyncio.TimerHandle | None = None
        self.limit_timer: asyncio.TimerHandle | None = None  # the next lease's time limit
        self.limit_at: float | None = None  # when limit_timer fires
        self.idle_timer: asyncio.TimerHandle | None = None
        self.stop: asyncio.Event | None = None
        self.start_lock: int | None = None  # held from an idle stop until the process exits
        self._names: dict[int, str] = {}  # uid -> "alice (uid 1000)", for the log
        self.metrics: MetricsEndpoint | None = None  # --metrics-port: fed from the loop
        self.watching = _watching_of(self)  # None: the GPUs are not watched

    def load_drained(self) -> None:
        """Put in force what the drain file says is drained (before anything is served);
        ServeError for a file that is not valid: no GPU an admin drained is ever granted."""
        try:
            drained = load_drained(self.drain_path, len(self.config.gpus))
        except DrainFileError as exc:
            raise ServeError(f"{exc}; not starting") from None
        self.state.restore_drained(drained, time.monotonic())
        if drained.server is not None:
            self.say(f"drained (as {str(self.drain_path)!r} says): the server: "
                     f"{drained.server or 'no reason given'}")  # fmt: skip
        for gpu, reason in drained.gpus:
            self.say(f"drained (as {str(self.drain_path)!r} says): GPU {gpu}: "
                     f"{reason or 'no reason given'}")  # fmt: skip

    def drain(self, client: Client, message: Drain, now: float) -> list[Delivery]:
        """``hwpool drain`` / ``resume``: checked, written to the drain file, then put in
        force (a change the file does not have is refused, changing nothing)."""
        drained = self.state.planned_drain(client, message)
        try:
            save_drained(self.drain_path, drained)
        except OSError as exc:
            self.say(f"cannot write the drain file {str(self.drain_path)!r}: {exc}")
            raise ProtocolError(
                ErrorCode.REPLY_FAILED,
                f"cannot write the drain file {str(self.drain_path)!r}: "
                f"{exc.strerror or exc}; nothing changed",
                message.req,
            ) from None
        return self.state.apply_drain(client, message, drained, now)

    def who(self, uid: int) -> str:
        """``alice (uid 1000)``, or ``uid 1000`` when no user has that uid, for the log;
        looked up once per uid (a lookup may ask a directory service)."""
        name = self._names.get(uid)
        if name is None:
            try:
                name = f"{printable(pwd.getpwuid(uid).pw_name)} (uid {uid})"
            except KeyError:
                name = f"uid {uid}"
            self._names[uid] = name
        return name

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
        """Count ``conn`` against its uid, or say why it is refused.

        Its role is not known before its hello: up to ``max_connections`` data connections
        and ``max_control_connections`` control ones may be open (or still saying hello) at
        once; each role's own cap is applied at the hello (:meth:`welcome`).
        """
        peer, config = conn.peer, self.config
        if not admitted(peer, self.uid, config.group):
            return refusal(peer.uid, self.uid, config.group)
        most = config.max_connections + config.max_control_connections
        if self.per_uid.get(peer.uid, 0) >= most:
            return (
                f"uid {peer.uid} already has {most} connections (--max-connections "
                f"{config.max_connections}, and {config.max_control_connections} for status "
                "and cancel)"
            )
        self.per_uid[peer.uid] = self.per_uid.get(peer.uid, 0) + 1
        conn.counted = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        return None

    def role_refusal(self, uid: int, role: str) -> str | None:
        """Why a connection of ``uid`` may not take ``role``, or None (then it is counted)."""
        config = self.config
        cap = config.max_connections if role == "data" else config.max_control_connections
        if self.per_role.get((uid, role), 0) >= cap:
            if role == "data":
                return (
                    f"uid {uid} already has {cap} connections (--max-connections {cap}); "
                    "`hwpool status` and `hwpool cancel` still work"
                )
            return f"uid {uid} already has {cap} control connections (for status and cancel)"
        self.per_role[uid, role] = self.per_role.get((uid, role), 0) + 1
        return None

    def forget(self, conn: _Connection) -> None:
        if conn.counted:
            conn.counted = False
            self.per_uid[conn.peer.uid] -= 1
            if not self.per_uid[conn.peer.uid]:
                del self.per_uid[conn.peer.uid]
            self.arm_idle()
        if conn.role is not None:
            key, conn.role = (conn.peer.uid, conn.role), None
            self.per_role[key] -= 1
            if not self.per_role[key]:
                del self.per_role[key]
        if conn.client is not None:
            self.by_client.pop(conn.client, None)
            if not self.stopping:  # stopping: its requests stay journaled, to be reclaimed
                self.after(self.state.disconnect(conn.client, time.monotonic()))

    def welcome(self, conn: _Connection, hello: Hello) -> None:
        if hello.version != PROTOCOL_VERSION:
            text = f"protocol version {hello.version} is not {PROTOCOL_VERSION} ({__version__})"
            conn.fail(ProtocolError(ErrorCode.VERSION, text))
            return
        refusal = self.role_refusal(conn.peer.uid, hello.role)
        if refusal is not None:
            conn.fail(ProtocolError(ErrorCode.REFUSED, refusal))
            return
        conn.role = hello.role
        self.numbers += 1
        conn.client = Client(
            self.numbers, conn.peer.uid, conn.peer.pid, token=hello.token or "",
            control=hello.role == "control", user=self.who(conn.peer.uid), notices=hello.notices,
            start=conn.start,
        )  # fmt: skip
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
            if isinstance(message, Status):  # after this turn's replies, like every reply
                self.outbox.append((conn, self.status_answer(conn.client, message)))
                self.after([])
                return
            deliveries = self.dispatch(conn.client, message, time.monotonic())
        except ProtocolError as exc:
            self.refuse(conn, exc)
            return
        except Exception:  # a bug of ours: this connection goes, the server stays
            self.say("internal error:\n" + traceback.format_exc().rstrip())
            conn.fail(ProtocolError(ErrorCode.INTERNAL, "internal server error"))
            return
        self.after(deliveries)

    def refuse(self, conn: _Connection, error: ProtocolError) -> None:
        """Answer ``error``: a fatal one at once (the connection goes), any other in order
        with the replies of this turn, which wait for the journal."""
        if error.code.fatal or conn.client is None:
            conn.fail(error)
            return
        self.outbox.append((conn, error.reply()))
        self.after([])

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
            case Give():
                return state.give(client, message, now)
            case Take():
                return state.take(client, message, now)
            case Drain():
                return self.drain(client, message, now)
        raise ProtocolError(ErrorCode.HELLO_FIRST, "hello comes first, and once")

    def status_answer(self, client: Client, message: Status) -> Iterator[bytes]:
        """The lines that answer ``message``: run when the connection's earlier replies are
        written, so the state it shows is the state then, after the journal is brought up to
        date, or says why it cannot be (``journal_error``). Never raises: a failure ends it
        with an error."""
        try:
            yield from status_lines(self.status_reply(message.req, client.uid), message.stream)
        except Exception:  # a bug of ours: this answer fails, the connection goes on
            self.say("internal error:\n" + traceback.format_exc().rstrip())
            text = "the server could not answer this status (it is in its log)"
            yield encode(ErrorReply(message.req, ErrorCode.REPLY_FAILED, text))

    def status_reply(self, req: int, viewer: int | None) -> StatusReply:
        """The state now as uid ``viewer`` may see it (None: all of it), with the journal's
        health and, where the GPUs are watched, what they really do: what ``hwpool status``,
        ``hwpool top`` and the metrics all show."""
        now = time.monotonic()
        reply = self.state.status(req, now, self.started, viewer, wall_offset=time.time() - now)
        reply = replace(reply, journal_error=self.journal_error)
        if self.watching is not None:
            reply = self.watching.decorate(reply, now)
        return reply

    def after(self, deliveries: list[Delivery]) -> None:
        """Send ``deliveries`` once this turn's changes are journaled (write-ahead)."""
        if self.metrics is not None:
            self.metrics.delivered(deliveries)
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
            outbox = [x for x in self.outbox if _is_status(x[1])]
            self.outbox = [x for x in self.outbox if not _is_status(x[1])]
        lines: dict[_Connection, list[bytes]] = {}  # each connection's replies, in order
        for conn, message in outbox:
            if isinstance(message, ServerMessage):  # (concrete classes: no ABC's isinstance)
                lines.setdefault(conn, []).append(conn.encoded(message))
                continue
            if conn in lines:  # what comes before the status or the close goes first
                conn.put_all(lines.pop(conn))
            if message is None:
                conn.close_when_sent()
            else:
                conn.stream(message)
        for conn, replies in lines.items():
            conn.put_all(replies)
        self.arm_limits()

    # ----------------------------------------------------------------- time limits
    def arm_limits(self) -> None:
        """Have the loop call :meth:`expire_limits` when the earliest time limit of a lease
        runs out (on the loop's clock, ``time.monotonic()``, the state's)."""
        end = self.state.next_deadline()
        if end == self.limit_at or self.loop is None or self.stopping:
            return
        if self.limit_timer is not None:
            self.limit_timer.cancel()
        self.limit_timer, self.limit_at = None, end
        if end is not None:
            delay = max(0.0, end - time.monotonic())  # the loop's own clock may differ
            self.limit_timer = self.loop.call_later(delay, self.expire_limits)

    def expire_limits(self) -> None:
        """Revoke the leases whose time limit has run out (journaled, then told, as any
        change), and arm the timer for the next one."""
        self.limit_timer = self.limit_at = None
        self.after(self.state.expire(time.monotonic()))
        self.arm_limits()

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
        try:
            fd = open_side_file(
                start_lock_path(self.config.socket), os.O_RDWR | os.O_CREAT, what="start lock"
            )
        except OSError as exc:  # unsafe (planted) or unusable: keep serving, say why once
            self.say(f"not stopping when idle: {exc}")
            return
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
        if self.metrics is not None:
            self.attach_metrics(self.metrics, loop)
        stop = self.stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        self.recover()
        self.flush()  # the journal starts anew from what was recovered
        server = await loop.create_unix_server(lambda: _Connection(self), sock=sock)
        self.say(
            f"serving {len(self.config.gpus)} GPU{'' if len(self.config.gpus) == 1 else 's'} "
            f"on {str(self.config.socket)!r} "
            f"(pid {os.getpid()}, uid {self.uid}"
            + ("" if self.config.group is None else f", group {self.config.group}")
            + (
                ""
                if self.config.admin_group is None
                else f", admin group {self.config.admin_group}"
            )
            + f"); policy {self.config.policy}, half-life {self.config.half_life:g} s"
            + "".join(
                f", {_owner_said(owner)} share {share:g}"
                for owner, share in self.config.shares.items()
            )
            + _limits_said(self.config)
            + _accounts_said(self.config)
        )
        for device, why in self.config.left_out:
            self.say(f"left out {device}: {printable(why)} (the driver could not read it)")
        self.arm_idle()
        self.start_watching(loop)
        try:
            await stop.wait()
        finally:
            if self.watching is not None:
                self.watching.stop()
            server.close()
            if self.metrics is not None:
                self.metrics.stop()
            self.stop_serving()
            self.config.socket.unlink(missing_ok=True)
            self.loop = None
            self.say("stopped")

    def attach_metrics(self, metrics: MetricsEndpoint, loop: asyncio.AbstractEventLoop) -> None:
        """Let ``metrics`` count grants and revocations and take snapshots in ``loop``."""
        from ._metrics import ServerView  # noqa: PLC0415  (only with --metrics-port)

        def status_now() -> StatusReply:  # the whole state, as an admin sees it
            return self.status_reply(0, None)

        view = ServerView(loop, status_now, self.config.gpus, self.config.totals,
                          self.state.units_per_gpu)  # fmt: skip
        metrics.attach(view)
        self.state.on_grant = metrics.granted

    def start_watching(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start sampling the GPUs (see ``_watching``), or say why they are not watched."""
        refusal = watch_refusal(self.config.gpus, self.config.watch_interval_s)
        if refusal is not None or self.watching is None:
            self.say(refusal or "the GPUs are not watched")
            return
        config = self.config
        self.say(
            f"watching the GPUs every {config.watch_interval_s:g} s; over-lease policy "
            f"{config.over_lease}"
            + "".join(
                f", {_owner_said(owner)} {policy}"
                for owner, policy in sorted(
                    config.over_lease_owners.items(), key=lambda item: _owner_key(item[0])
                )
            )
            + (
                f", grace {config.over_lease_grace_s:g} s"
                if "term" in (config.over_lease, *config.over_lease_owners.values())
                else ""
            )
        )
        self.watching.start(loop)

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


def _watching_of(server: _Server) -> Watching | None:
    """The server's GPU watch, or None where it does not watch (see ``watch_refusal``)."""
    config = server.config
    if watch_refusal(config.gpus, config.watch_interval_s) is not None:
        return None
    return Watching(
        server.state, config.gpus, interval_s=config.watch_interval_s, policy=config.over_lease,
        owner_policies=config.over_lease_owners, grace_s=config.over_lease_grace_s,
        say=server.say, after=server.after,
    )  # fmt: skip


def _is_status(message: ServerMessage | Iterator[bytes] | None) -> bool:
    """Whether ``message`` is a status answer (sent even while the journal cannot be)."""
    return isinstance(message, StatusReply | Iterator)


def admins_of(server_uid: int, admin_group: int | None) -> frozenset[int]:
    """Who may act on anyone's requests (cancel, drain): root, the server's own uid, and
    the members of ``admin_group`` as the system says when the server starts."""
    members = set() if admin_group is None else group_members(admin_group)
    return frozenset({0, server_uid, *members})


def serve(config: ServeConfig, out: TextIO | None = None) -> None:
    """Run the server until SIGTERM or SIGINT; ServeError if it cannot start."""
    prepare_directory(config.socket.parent, config.group)
    lock = hold_lock(config.socket)
    server: _Server | None = None
    metrics: MetricsEndpoint | None = None
    try:
        if config.metrics_port is not None:  # first: a port in use leaves no socket behind
            from ._metrics import MetricsEndpoint  # noqa: PLC0415  (prometheus-client)

            metrics = MetricsEndpoint.start(
                config.metrics_host, config.metrics_port, config.metrics_max_connections,
                config.metrics_timeout_s,
            )  # fmt: skip
        server = _Server(config, sys.stderr if out is None else out)  # (a bad drain file:
        sock = bind(config.socket, config.group)  # no socket is left behind)
        if metrics is not None:
            server.metrics = metrics
            server.say(f"metrics on {metrics.said}")
        asyncio.run(server.run(sock))
    finally:
        if metrics is not None:
            metrics.stop()
        os.close(lock)
        if server is not None and server.start_lock is not None:
            os.close(server.start_lock)  # after the server lock: a new server can take that


def _limits_said(config: ServeConfig) -> str:
    """``, limits: default gpus=2 mode=wait, uid 1000 gpus=8 mode=refuse`` for the start-up
    line (memory in MiB)."""

    def said(limits: OwnerLimits) -> str:
        keys = (("gpus", "gpus"), ("memory", "units"), ("running", "running"), ("queued", "queued"))
        parts = [
            f"{key}={getattr(limits, field):g}"
            for key, field in keys
            if getattr(limits, field) is not None
        ]
        return " ".join([*parts, f"mode={limits.mode}"])

    told = [
        f"{_owner_said(owner)} {said(limits)}"
        for owner, limits in sorted(config.limits.items(), key=lambda item: _owner_key(item[0]))
    ]
    if config.default_limits is not None:
        told.insert(0, f"default {said(config.default_limits)}")
    return f", limits: {', '.join(told)}" if told else ""


def _owner_said(owner: Owner) -> str:
    """``uid 1000`` or ``account ml``, for the start-up line."""
    return f"account {owner}" if isinstance(owner, str) else f"uid {owner}"


def _owner_key(owner: Owner) -> tuple[int, int, str]:
    """uids by number, then accounts by name."""
    return (1, 0, owner) if isinstance(owner, str) else (0, owner, "")


def _accounts_said(config: ServeConfig) -> str:
    """``, accounts: ml (uids 1001, 1002), ops (no members now)`` for the start-up line (at
    most 8 uids an account: a group may have hundreds)."""

    def members(uids: frozenset[int]) -> str:
        if not uids:
            return "no members now"
        shown = ", ".join(map(str, sorted(uids)[:8]))
        return f"uids {shown}" + (f", ... {len(uids)} in all" if len(uids) > 8 else "")

    told = [f"{name} ({members(uids)})" for name, uids in sorted(config.accounts.items())]
    return f", accounts: {', '.join(told)}" if told else ""
