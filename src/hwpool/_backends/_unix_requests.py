"""The unix backend's records of its requests, and how a thread waits for an answer.

A ``_Req`` follows one request of this process from ``acquire`` until it is released or
fails; a ``_Call`` one round trip answered once (status, bye, a hand-over). A thread waits on
its own wake-up token (``_wait``), in slices on the main thread so that a signal is acted on.
The labels a request carries (``_label``) are checked here, before anything is sent.
"""

from __future__ import annotations

import asyncio
import enum
import pwd
import threading
import time
from threading import get_ident

from .._core._scheduler import Demand, Grant
from .._errors import RevokedError
from .._printable import printable
from .._wire._protocol import (
    MAX_TEXT,
    ClientMessage,
    ErrorCode,
    ErrorReply,
    ServerMessage,
    StatusPart,
    Unit,
)

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


def _error_for(message: ErrorReply) -> BaseException:
    if message.code is ErrorCode.CANCELLED:
        return RevokedError(message.message)
    if message.code is ErrorCode.BAD_REQUEST:
        return ValueError(message.message)
    return ConnectionError(f"the hwpool server refused the request: {message.message}")
