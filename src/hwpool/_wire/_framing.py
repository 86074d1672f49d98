"""Lines on the wire and how they fail: the protocol's version and limits, the error codes
(which of them end the connection), :class:`ProtocolError` and the ``error`` message that
reports it, and :class:`LineBuffer`, which cuts a byte stream into lines no longer than
``MAX_LINE``."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

PROTOCOL_VERSION = 1
MAX_LINE = 64 * 1024
"""The longest line either side accepts, newline included; a longer one is a fatal error."""
MAX_MESSAGE = 1024
"""The longest ``message`` an ``error`` carries (in characters; a longer one is cut)."""
MAX_GPUS = 4096

TOKEN = re.compile(r"[0-9A-Za-z_-]{1,64}")
"""What a hello's ``token`` may be: 1 to 64 letters, digits, ``_`` or ``-``."""

TICKET = re.compile(r"[0-9A-Za-z_-]{16,64}")
"""What a hand-over ticket (``given``, ``take``) may be: 16 to 64 letters, digits, ``_`` or
``-`` (the server makes 32, ``secrets.token_urlsafe(24)``)."""

Role = Literal["data", "control"]
"""What a connection is for (its hello's ``role``): requests (``data``, the default), or only
``status`` and ``cancel`` (``control``: admitted beyond the per-uid connection cap)."""

Unit = Literal["gpu", "mib"]
"""What a request's ``units`` count: a share of a GPU in ``units_per_gpu`` units (``gpu``, the
default, left out on the wire), or MiB of memory on a server sized in memory (``mib``)."""


class ErrorCode(enum.StrEnum):
    """Why a request or a connection failed (the ``code`` of an ``error`` message)."""

    BAD_JSON = "bad_json"  # not UTF-8 JSON, or not an object
    TOO_LONG = "too_long"  # a line longer than MAX_LINE
    BAD_MESSAGE = "bad_message"  # a field missing, of the wrong type or out of range
    UNKNOWN_OP = "unknown_op"
    VERSION = "version"  # the hello's version is not one the server speaks
    HELLO_FIRST = "hello_first"  # a request before hello, or a second hello
    TIMEOUT = "timeout"  # no hello, or half a line, for too long
    REFUSED = "refused"  # this uid may not use this server, or too many connections
    FORBIDDEN = "forbidden"  # not the owner (nor an admin) of what the request names
    NOT_FOUND = "not_found"  # no such request, lease or waiter
    BAD_REQUEST = "bad_request"  # a demand this server can never serve
    LOST = "lost"  # a reclaimed lease that no longer fits after a restart
    CANCELLED = "cancelled"  # an admin withdrew this waiting request
    LIMIT = "limit"  # a cap on requests per connection or uid, or the uid's [limits], refuses it
    SHUTTING_DOWN = "shutting_down"
    REPLY_FAILED = "reply_failed"  # the server could not encode its reply: logged, goes on
    INTERNAL = "internal"  # a bug in the server: this connection is closed, the others go on

    @property
    def fatal(self) -> bool:
        """Whether the server closes the connection after sending this error."""
        return self in _FATAL


_FATAL = frozenset(
    {
        ErrorCode.BAD_JSON,
        ErrorCode.TOO_LONG,
        ErrorCode.VERSION,
        ErrorCode.HELLO_FIRST,
        ErrorCode.TIMEOUT,
        ErrorCode.INTERNAL,
        ErrorCode.REFUSED,
        ErrorCode.SHUTTING_DOWN,
    }
)


class ProtocolError(Exception):
    """A message that cannot be served: ``code``, a human ``message`` and its ``req`` if known."""

    def __init__(self, code: ErrorCode, message: str, req: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.req = req

    def reply(self) -> ErrorReply:
        """The ``error`` message that reports this to the peer."""
        return ErrorReply(self.req, self.code, self.message)


# ----------------------------------------------------------------- framing
class LineBuffer:
    """Splits a byte stream into lines, refusing any line longer than ``MAX_LINE``.

    ``feed`` returns the complete lines (without their newline) and keeps the rest; it raises
    ProtocolError(TOO_LONG) as soon as the unfinished line is too long, so a peer can never
    make the receiver hold more than ``MAX_LINE`` bytes.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    @property
    def partial(self) -> bool:
        """Whether half a line is waiting for the rest."""
        return bool(self._pending)

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._pending += data
            self._check(self._pending, 1)  # it still needs its newline
            return []
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        for line in lines:
            self._check(line, 1)
        self._check(self._pending, 1)
        return lines

    @staticmethod
    def _check(line: bytes, newline: int) -> None:
        if len(line) + newline > MAX_LINE:
            raise ProtocolError(ErrorCode.TOO_LONG, f"a line is longer than {MAX_LINE} bytes")


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Request ``req`` (None: the connection itself) failed with ``code``."""

    req: int | None
    code: ErrorCode
    message: str
    op: ClassVar[str] = "error"

    def wire(self) -> dict[str, object]:
        message = self.message
        if len(message) > MAX_MESSAGE:  # a message may quote what the client sent
            message = message[: MAX_MESSAGE - 3] + "..."
        return {"op": self.op, "req": self.req, "code": self.code.value, "message": message}
