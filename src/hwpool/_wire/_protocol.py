"""The wire protocol between hwpool clients and ``hwpool serve``: pure, versioned and strict.

Framing: one JSON object per line, UTF-8, ending in ``\\n``, at most ``MAX_LINE`` bytes with the
newline. Every object has an ``op``. The client speaks first (``hello``, carrying
``PROTOCOL_VERSION``); the server answers ``welcome`` or a fatal ``error`` and closes. After
that every client request carries ``req``, an int the client picks and never reuses on one
connection; the server answers each request once, with the same ``req`` (an ``acquire``
that waits also gets a ``queued`` first), except ``release``, ``withdraw`` and ``reclaimed``,
which are answered only when they fail; it may push ``revoked`` at any time. A lease may be
handed over to another connection of the same uid: ``give`` answers ``given`` with a secret
ticket, and ``take`` with that ticket answers ``granted`` on the taker's connection. A ``status``
that asks for ``stream`` may be answered in several lines: ``status_part`` lines, then the
``status`` line that ends it (see :func:`status_lines`), so that it fits any queue.
Fields the receiver does not know are ignored, so later versions may add optional ones.

Capacity is counted in the server's units. A server that shares fractions counts
``units_per_gpu`` per GPU. A server sized in memory (``hwpool serve --memory``) says so with
``totals`` (MiB per GPU) in its welcome; a request then says ``"unit": "mib"`` for an amount of
memory, or leaves ``unit`` out for a share of a GPU in ``units_per_gpu`` units (that share of
whichever GPU it lands on; a whole share, or ``count`` > 1, is whole GPUs), so a client that
knows nothing of memory still asks for what it means.

This module does no I/O: it turns bytes into validated messages and back. Decoding raises
:class:`ProtocolError`, whose ``code`` says whether the connection can go on (``fatal``).
``docs/protocol.md`` documents every message.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from .._check import check_bool, check_int, check_real
from .._core._scheduler import Demand
from .._host._detect import GPUInfo
from ._bounds import MAX_ID, MAX_PRIORITY, MAX_TEXT

__all__ = [
    "MAX_ACCOUNT_NAME",
    "MAX_LINE",
    "MAX_OUTSIDE",
    "MAX_OWNERS",
    "MAX_PRIORITY",
    "MAX_TEXT",
    "PROTOCOL_VERSION",
    "TICKET",
    "AccountRecord",
    "Acquire",
    "Busy",
    "Bye",
    "Cancel",
    "ClientMessage",
    "Done",
    "ErrorCode",
    "ErrorReply",
    "GPUStateRecord",
    "Give",
    "Given",
    "Granted",
    "Hello",
    "LeaseRecord",
    "LineBuffer",
    "Notice",
    "OutsideRecord",
    "OwnerRecord",
    "ProtocolError",
    "Queued",
    "Reclaim",
    "Reclaimed",
    "Release",
    "RevokeReason",
    "Revoked",
    "Role",
    "ServerMessage",
    "Status",
    "StatusPart",
    "StatusReply",
    "Take",
    "TakenRequest",
    "Unit",
    "WaiterRecord",
    "WatchRecord",
    "Welcome",
    "Withdraw",
    "decode_client",
    "decode_server",
    "encode",
    "join_status",
    "request_for",
    "status_lines",
]

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


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)  # made once: dumps()
# with arguments would build a new encoder for every message


def encode(message: ClientMessage | ServerMessage) -> bytes:
    """One message as its line (compact JSON and a newline); ValueError if over MAX_LINE."""
    line = _plain_line(message)
    if line is None:
        line = _ENCODER.encode(message.wire()).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ValueError(f"{message.op} message of {len(line)} bytes exceeds {MAX_LINE}")
    return line


_NO_OPTIONS = (None, None, None, None)


def _plain_line(message: ClientMessage | ServerMessage) -> bytes | None:
    """The line of a message every grant exchanges (an ``acquire`` without options, a
    ``queued``, a ``granted`` not of a take, a whole ``release``), formatted directly (a few
    times faster than building its dict and encoding that; the same bytes), else None."""
    kind = type(message)
    if kind is Granted:
        assert isinstance(message, Granted)
        if message.request is not None:
            return None
        gpus = ",".join(map(str, message.gpus))
        return (
            f'{{"op":"granted","req":{message.req},"id":{message.id},"gpus":[{gpus}],'
            f'"units":{message.units}}}\n'
        ).encode()
    if kind is Queued:
        assert isinstance(message, Queued)
        return f'{{"op":"queued","req":{message.req},"id":{message.id}}}\n'.encode()
    if kind is Release:
        assert isinstance(message, Release)
        if message.gpu is not None:
            return None
        return f'{{"op":"release","req":{message.req},"of":{message.of}}}\n'.encode()
    if kind is Acquire:
        assert isinstance(message, Acquire)
        options = (message.name, message.command, message.expected_s, message.limit_s)
        if options != _NO_OPTIONS or message.unit != "gpu" or message.priority:
            return None  # labels, a hint, a unit, a priority or a limit: the general way
        wait = "true" if message.wait else "false"
        return (
            f'{{"op":"acquire","req":{message.req},"count":{message.count},'
            f'"units":{message.units},"wait":{wait}}}\n'
        ).encode()
    return None


# ----------------------------------------------------------------- field reading
class _Fields:
    """Typed access to one decoded object; every failure is a BAD_MESSAGE naming the field."""

    __slots__ = ("obj", "op", "req")

    def __init__(self, obj: Mapping[str, object], op: str, req: int | None) -> None:
        self.obj, self.op, self.req = obj, op, req

    def fail(self, what: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_MESSAGE, f"{self.op}: {what}", self.req)

    def get(self, key: str) -> object:
        if key not in self.obj:
            raise self.fail(f"field {key!r} is missing")
        return self.obj[key]

    def num(self, key: str, lo: int = 0, hi: int = MAX_ID) -> int:
        value = self.obj.get(key)
        if type(value) is int and lo <= value <= hi:  # the common case, without the ABCs
            return value
        try:
            return check_int(key, self.get(key), minimum=lo, maximum=hi)
        except (TypeError, ValueError) as exc:
            raise self.fail(str(exc)) from None

    def opt_num(self, key: str, lo: int = 0, hi: int = MAX_ID) -> int | None:
        return None if self.obj.get(key) is None else self.num(key, lo, hi)

    def flag(self, key: str) -> bool:
        value = self.obj.get(key)
        if value is True or value is False:  # the common case
            return value
        try:
            return check_bool(key, self.get(key))
        except TypeError as exc:
            raise self.fail(str(exc)) from None

    def opt_flag(self, key: str) -> bool:
        """An optional bool, False when left out (or null)."""
        return False if self.obj.get(key) is None else self.flag(key)

    def age(self, key: str) -> float:
        try:
            number = check_real(key, self.get(key))
        except (TypeError, ValueError) as exc:
            raise self.fail(str(exc)) from None
        if not 0.0 <= number < math.inf:
            raise self.fail(f"{key} must be a finite number >= 0, got {number!r}")
        return number

    def text(self, key: str, limit: int = MAX_TEXT) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise self.fail(f"{key} must be a string, got {value!r}")
        if len(value) > limit:
            raise self.fail(f"{key} is longer than {limit} characters")
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:  # a lone surrogate: no line could carry it on
                raise self.fail(f"{key} holds a lone surrogate, which UTF-8 cannot carry") from None
        return value

    def opt_text(self, key: str) -> str | None:
        return None if self.obj.get(key) is None else self.text(key)

    def ints(self, key: str, hi: int = MAX_GPUS - 1) -> tuple[int, ...]:
        value = self.get(key)
        if not isinstance(value, list) or len(value) > MAX_GPUS:
            raise self.fail(f"{key} must be a list of at most {MAX_GPUS} ints")
        if all(type(v) is int and 0 <= v <= hi for v in value):  # the common case
            return tuple(value)
        return tuple(_Fields({key: v}, self.op, self.req).num(key, 0, hi) for v in value)

    def pairs(self, key: str) -> tuple[tuple[int, int], ...]:
        value = self.get(key)
        if not isinstance(value, list) or not 0 < len(value) <= MAX_GPUS:
            raise self.fail(f"{key} must be a non-empty list of [gpu, units] pairs")
        pairs = []
        for item in value:
            if not isinstance(item, list) or len(item) != 2:
                raise self.fail(f"{key} must hold [gpu, units] pairs, got {item!r}")
            pair = _Fields({"gpu": item[0], "units": item[1]}, self.op, self.req)
            pairs.append((pair.num("gpu", 0, MAX_GPUS - 1), pair.num("units", 1)))
        return tuple(pairs)

    def objects(self, key: str) -> list[_Fields]:
        value = self.get(key)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.fail(f"{key} must be a list of objects")
        return [_Fields(v, self.op, self.req) for v in value]


def _load(line: bytes) -> dict[str, object]:
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError(ErrorCode.BAD_JSON, "a line is not valid UTF-8 JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, f"a message must be a JSON object, got {obj!r}")
    return obj


def _opened(line: bytes, side: str) -> _Fields:
    """The object of ``line`` with its op and, best effort, its req (for error replies)."""
    obj = _load(line)
    op = obj.get("op")
    raw = obj.get("req")
    req = raw if type(raw) is int and 0 <= raw <= MAX_ID else None  # best effort, for errors
    if not isinstance(op, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"a {side} message needs a string 'op'", req)
    return _Fields(obj, op, req)


def request_for(demand: Demand, sized: bool, units_per_gpu: int) -> tuple[int, int, Unit]:
    """``count``, ``units`` and ``unit`` of the request that asks for ``demand``, on a server
    sized in memory (``sized``) or not: MiB for an amount of one GPU's memory, else a share
    of a GPU (relative or whole) in ``units_per_gpu`` units."""
    if not sized or demand.relative:
        return demand.count, demand.units, "gpu"
    if demand.whole or demand.count > 1:
        return demand.count, units_per_gpu, "gpu"
    return 1, demand.units, "mib"


def _texts(f: _Fields) -> dict[str, str | None]:
    return {"name": f.opt_text("name"), "command": f.opt_text("command")}


def _unit(f: _Fields) -> Unit:
    """The optional ``unit`` of a request: ``gpu`` when left out."""
    value = f.obj.get("unit", "gpu")
    if value == "mib":
        return "mib"
    if value == "gpu":
        return "gpu"
    raise f.fail(f"unit must be 'gpu' or 'mib', got {value!r}")


# ----------------------------------------------------------------- client messages
@dataclass(frozen=True, slots=True)
class Hello:
    """The first message of a connection: the protocol version the client speaks.

    ``token`` (optional) names the client across its reconnects: one pool of one process
    makes a random one and sends it on every connection, so that after a restart the server
    matches reclaims to the client that journaled them, not to its pid. ``role`` ``control``
    asks for a connection that only asks for ``status`` and ``cancel``.
    """

    version: int
    client: str
    token: str | None = None
    role: Role = "data"
    notices: bool = False  # it reads ``notice`` messages (a client of this version does)
    op: ClassVar[str] = "hello"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"op": self.op, "version": self.version, "client": self.client}
        if self.token is not None:
            out["token"] = self.token
        if self.role != "data":
            out["role"] = self.role
        if self.notices:
            out["notices"] = True
        return out


@dataclass(frozen=True, slots=True)
class Acquire:
    """Ask for ``count`` GPUs with ``units`` each; ``wait=False`` is the nowait form.

    ``name`` and ``command`` only label the request in ``hwpool status``; ``expected_s``
    (optional) is how long the client expects to hold the grant, for the policy.
    ``priority`` (optional, ``-MAX_PRIORITY..MAX_PRIORITY``, default 0) orders it among the
    same user's waiters only (higher first): it never passes another user's. ``limit_s``
    (optional, finite and > 0): a time limit the server enforces, revoking the grant once
    held that long (``revoked`` with ``reason`` ``limit``); the policy may count on it.
    """

    req: int
    count: int
    units: int
    wait: bool
    name: str | None = None
    command: str | None = None
    expected_s: float | None = None
    unit: Unit = "gpu"
    priority: int = 0
    limit_s: float | None = None
    op: ClassVar[str] = "acquire"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "op": self.op, "req": self.req, "count": self.count, "units": self.units,
            "wait": self.wait,
        }  # fmt: skip
        _put_texts(out, self.name, self.command)
        if self.expected_s is not None:
            out["expected_s"] = self.expected_s
        if self.unit != "gpu":
            out["unit"] = self.unit
        if self.priority:
            out["priority"] = self.priority
        if self.limit_s is not None:
            out["limit_s"] = self.limit_s
        return out


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Give up request ``of``: withdraw it if it waits, give its grant back if it raced ahead."""

    req: int
    of: int
    timed_out: bool = False
    op: ClassVar[str] = "withdraw"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req, "of": self.of, "timed_out": self.timed_out}


@dataclass(frozen=True, slots=True)
class Release:
    """Give back all of lease ``of``, or only ``units`` on its GPU ``gpu`` (both or neither)."""

    req: int
    of: int
    gpu: int | None = None
    units: int | None = None
    op: ClassVar[str] = "release"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"op": self.op, "req": self.req, "of": self.of}
        if self.gpu is not None:
            out["gpu"], out["units"] = self.gpu, self.units
        return out


@dataclass(frozen=True, slots=True)
class Reclaim:
    """After a reconnect: re-declare request ``id`` of the previous connection under ``req``.

    ``held`` lists the ``(gpu, units)`` a lease still holds; ``None`` means the request was
    still waiting. ``age_s`` is how long it has been held or waited. ``limit_s``: the time
    limit it was asked with (a lease's counts from its grant, ``age_s`` ago; the journal's
    record of it wins over this).
    """

    req: int
    id: int
    count: int
    units: int
    held: tuple[tuple[int, int], ...] | None
    age_s: float
    name: str | None = None
    command: str | None = None
    unit: Unit = "gpu"
    limit_s: float | None = None
    op: ClassVar[str] = "reclaim"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "op": self.op, "req": self.req, "id": self.id, "count": self.count,
            "units": self.units, "age_s": self.age_s,
            "held": None if self.held is None else [list(p) for p in self.held],
        }  # fmt: skip
        _put_texts(out, self.name, self.command)
        if self.unit != "gpu":
            out["unit"] = self.unit
        if self.limit_s is not None:
            out["limit_s"] = self.limit_s
        return out


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """After a reconnect: every lease and waiter of this client has been re-declared."""

    req: int
    op: ClassVar[str] = "reclaimed"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req}


@dataclass(frozen=True, slots=True)
class Status:
    """Ask for the whole host's state (``hwpool status``, ``snapshot()``).

    ``stream``: the client reads ``status_part`` lines before the ``status`` that ends the
    answer, so that the whole state comes, however long the queue. Without it the answer is
    one line, cut to fit (its ``*_left_out`` counts say how much was left out).
    """

    req: int
    stream: bool = False
    op: ClassVar[str] = "status"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"op": self.op, "req": self.req}
        if self.stream:
            out["stream"] = True
        return out


@dataclass(frozen=True, slots=True)
class Bye:
    """The client is done: release everything of this connection, answer ``ok``, close."""

    req: int
    op: ClassVar[str] = "bye"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req}


@dataclass(frozen=True, slots=True)
class Cancel:
    """Withdraw the waiter or revoke the lease with server-wide ``id`` (owner or admin only)."""

    req: int
    id: int
    op: ClassVar[str] = "cancel"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req, "id": self.id}


@dataclass(frozen=True, slots=True)
class Give:
    """Offer lease ``id`` (held by this connection, whole) for hand-over: the server answers
    ``given`` with a fresh secret ticket, which a ``take`` on another connection of the same
    uid uses to become its holder. Until then the lease stays this connection's."""

    req: int
    id: int
    op: ClassVar[str] = "give"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req, "id": self.id}


@dataclass(frozen=True, slots=True)
class Take:
    """Become the holder of lease ``id``, given with ``ticket`` by a connection of the same uid.

    ``name`` and ``command`` (optional) label the lease anew in ``hwpool status``; left out,
    it keeps its own. Answered ``granted`` (with ``request``) under this ``req``.
    """

    req: int
    id: int
    ticket: str
    name: str | None = None
    command: str | None = None
    op: ClassVar[str] = "take"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"op": self.op, "req": self.req, "id": self.id,
                                  "ticket": self.ticket}  # fmt: skip
        _put_texts(out, self.name, self.command)
        return out


def _put_texts(out: dict[str, object], name: str | None, command: str | None) -> None:
    if name is not None:
        out["name"] = name
    if command is not None:
        out["command"] = command


ClientMessage = (
    Hello | Acquire | Withdraw | Release | Reclaim | Reclaimed | Status | Cancel | Bye | Give | Take
)


def _hello(f: _Fields) -> Hello:
    token = f.obj.get("token")
    if token is not None and (not isinstance(token, str) or not TOKEN.fullmatch(token)):
        raise f.fail(f"token must be 1 to 64 letters, digits, '_' or '-', got {token!r:.80}")
    return Hello(f.num("version"), f.text("client", 256), token, _role(f), f.opt_flag("notices"))


def _role(f: _Fields) -> Role:
    """The optional ``role`` of a hello: ``data`` when left out."""
    value = f.obj.get("role", "data")
    if value == "control":
        return "control"
    if value == "data":
        return "data"
    raise f.fail(f"role must be 'data' or 'control', got {value!r:.80}")


def _acquire(f: _Fields) -> Acquire:
    if len(f.obj) == 5:  # op and the four fields it needs: no option to read
        return Acquire(f.num("req"), f.num("count", 1, MAX_GPUS), f.num("units", 1), f.flag("wait"))
    expected = None if f.obj.get("expected_s") is None else f.age("expected_s")
    return Acquire(
        f.num("req"), f.num("count", 1, MAX_GPUS), f.num("units", 1), f.flag("wait"),
        **_texts(f), expected_s=expected, unit=_unit(f),
        priority=f.opt_num("priority", -MAX_PRIORITY, MAX_PRIORITY) or 0,
        limit_s=_limit(f),
    )  # fmt: skip


def _limit(f: _Fields) -> float | None:
    """The optional ``limit_s`` of a request: a finite number of seconds > 0."""
    if f.obj.get("limit_s") is None:
        return None
    number = f.age("limit_s")
    if number <= 0.0:
        raise f.fail(f"limit_s must be a finite number of seconds > 0, got {number!r}")
    return number


def _withdraw(f: _Fields) -> Withdraw:
    return Withdraw(f.num("req"), f.num("of"), f.flag("timed_out"))


def _release(f: _Fields) -> Release:
    gpu, units = f.opt_num("gpu", 0, MAX_GPUS - 1), f.opt_num("units", 1)
    if (gpu is None) != (units is None):
        raise f.fail("give both 'gpu' and 'units', or neither")
    return Release(f.num("req"), f.num("of"), gpu, units)


def _reclaim(f: _Fields) -> Reclaim:
    held = None if f.get("held") is None else f.pairs("held")
    if held is not None and len({gpu for gpu, _ in held}) != len(held):
        twice = sorted({gpu for gpu, _ in held if sum(g == gpu for g, _ in held) > 1})
        raise f.fail(f"held names GPU {twice[0]} more than once")
    return Reclaim(
        f.num("req"), f.num("id", 1), f.num("count", 1, MAX_GPUS), f.num("units", 1), held,
        f.age("age_s"), **_texts(f), unit=_unit(f), limit_s=_limit(f),
    )  # fmt: skip


_CLIENT: dict[str, Callable[[_Fields], ClientMessage]] = {
    "hello": _hello,
    "acquire": _acquire,
    "withdraw": _withdraw,
    "release": _release,
    "reclaim": _reclaim,
    "reclaimed": lambda f: Reclaimed(f.num("req")),
    "status": lambda f: Status(f.num("req"), f.opt_flag("stream")),
    "cancel": lambda f: Cancel(f.num("req"), f.num("id", 1)),
    "bye": lambda f: Bye(f.num("req")),
    "give": lambda f: Give(f.num("req"), f.num("id", 1)),
    "take": lambda f: Take(f.num("req"), f.num("id", 1), _ticket(f), **_texts(f)),
}


def _ticket(f: _Fields) -> str:
    """The ``ticket`` of a ``take`` or ``given``: see :data:`TICKET`."""
    value = f.get("ticket")
    if not isinstance(value, str) or not TICKET.fullmatch(value):
        raise f.fail(f"ticket must be 16 to 64 letters, digits, '_' or '-', got {value!r:.80}")
    return value


def decode_client(line: bytes) -> ClientMessage:
    """Validate one line from a client; raise ProtocolError saying what is wrong."""
    f = _opened(line, "client")
    parse = _CLIENT.get(f.op)
    if parse is None:
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {f.op[:64]!r}", f.req)
    return parse(f)


# ----------------------------------------------------------------- server messages
@dataclass(frozen=True, slots=True)
class Welcome:
    """The server's answer to hello: who it is and the GPUs it shares out.

    ``recovering`` is true during the grace period after a restart, while clients reclaim.
    ``totals`` is each GPU's capacity in MiB on a server sized in memory, None on one that
    shares fractions (its GPUs have ``units_per_gpu`` each).
    """

    version: int
    server: str
    pid: int
    uid: int
    units_per_gpu: int
    gpus: tuple[GPUInfo, ...]
    recovering: bool
    totals: tuple[int, ...] | None = None
    op: ClassVar[str] = "welcome"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "op": self.op, "version": self.version, "server": self.server, "pid": self.pid,
            "uid": self.uid, "units_per_gpu": self.units_per_gpu,
            "gpus": [
                {"index": g.index, "device_id": g.device_id, "uuid": g.uuid,
                 "memory_mib": g.memory_mib, "name": g.name, "parent": g.parent}
                for g in self.gpus
            ],
            "recovering": self.recovering,
        }  # fmt: skip
        if self.totals is not None:
            out["totals"] = list(self.totals)
        return out


@dataclass(frozen=True, slots=True)
class TakenRequest:
    """What a lease taken over (``take``) was asked as, so that its new holder can re-declare
    it after a restart (``reclaim``) and label it: ``count``, ``units`` and ``unit`` as its
    ``acquire`` had them, its time limit (``limit_s``, from its grant), how long it has been
    held (``age_s``), and its labels."""

    count: int
    units: int
    age_s: float
    unit: Unit = "gpu"
    limit_s: float | None = None
    name: str | None = None
    command: str | None = None

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "count": self.count, "units": self.units, "age_s": round(self.age_s, 6),
        }  # fmt: skip
        if self.unit != "gpu":
            out["unit"] = self.unit
        if self.limit_s is not None:
            out["limit_s"] = self.limit_s
        _put_texts(out, self.name, self.command)
        return out


@dataclass(frozen=True, slots=True)
class Granted:
    """Request ``req`` holds ``units`` on each of ``gpus``; ``id`` names it host-wide.

    ``units`` is 0 for whole GPUs of different sizes on a server sized in memory: each GPU
    is then held whole (its total, as the welcome's ``totals`` says). ``request`` is sent
    only in answer to a ``take``: what the lease taken over was asked as.
    """

    req: int
    id: int
    gpus: tuple[int, ...]
    units: int
    request: TakenRequest | None = None
    op: ClassVar[str] = "granted"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "op": self.op, "req": self.req, "id": self.id, "gpus": list(self.gpus),
            "units": self.units,
        }  # fmt: skip
        if self.request is not None:
            out["request"] = self.request.wire()
        return out


@dataclass(frozen=True, slots=True)
class Given:
    """Lease ``id`` (of the ``give`` ``req``) may be taken with ``ticket`` (a secret: whoever
    of the same uid holds it may take the lease), until it is taken, ends, or its giver's
    connection closes, or a later ``give`` of it replaces the ticket."""

    req: int
    id: int
    ticket: str
    op: ClassVar[str] = "given"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req, "id": self.id, "ticket": self.ticket}


@dataclass(frozen=True, slots=True)
class Queued:
    """Request ``req`` waits in the queue as ``id``; a ``granted`` (or ``error``) follows."""

    req: int
    id: int
    op: ClassVar[str] = "queued"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req, "id": self.id}


@dataclass(frozen=True, slots=True)
class Busy:
    """A nowait request that cannot be granted without waiting."""

    req: int
    op: ClassVar[str] = "would_block"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req}


@dataclass(frozen=True, slots=True)
class Done:
    """Request ``req`` (a cancel, a bye) is done. For a cancel, ``cancelled`` says what the
    id was when it was cancelled: a ``lease`` (revoked) or a ``waiter`` (withdrawn)."""

    req: int
    cancelled: Literal["lease", "waiter"] | None = None
    op: ClassVar[str] = "ok"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"op": self.op, "req": self.req}
        if self.cancelled is not None:
            out["cancelled"] = self.cancelled
        return out


@dataclass(frozen=True, slots=True)
class Revoked:
    """Lease ``req`` (host-wide ``id``) was revoked by uid ``by``: its release is now a no-op.

    ``reason``: ``cancel`` (``hwpool cancel`` by ``by``; left out on the wire), ``limit``
    (its ``limit_s`` ran out; ``by`` is then the lease's own uid, which set the limit) or
    ``overuse`` (its processes used more GPU memory than it was leased, under the server's
    ``over_lease`` policy ``term``; ``by`` is the server's uid).
    """

    req: int
    id: int
    by: int
    reason: RevokeReason = "cancel"
    op: ClassVar[str] = "revoked"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"op": self.op, "req": self.req, "id": self.id, "by": self.by}
        if self.reason != "cancel":
            out["reason"] = self.reason
        return out


RevokeReason = Literal["cancel", "limit", "overuse"]

_REVOKE_REASONS: dict[object, RevokeReason] = {"limit": "limit", "overuse": "overuse"}


def _revoked(f: _Fields) -> Revoked:
    """A ``revoked``; an unknown ``reason`` (a later server's) reads as ``cancel``."""
    reason = _REVOKE_REASONS.get(f.obj.get("reason"), "cancel")
    return Revoked(f.num("req"), f.num("id", 1), f.num("by"), reason)


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the client should tell its job about lease ``req`` (host-wide ``id``), in
    words (``text``, at most MAX_TEXT characters): today, that the lease's processes use more
    GPU memory than it was leased. Sent only to a client whose hello said ``notices``."""

    req: int
    id: int
    text: str
    op: ClassVar[str] = "notice"

    def wire(self) -> dict[str, object]:
        return {"op": self.op, "req": self.req, "id": self.id, "text": self.text[:MAX_TEXT]}


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


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One lease in a status reply: who holds what, for how long."""

    id: int
    uid: int
    pid: int
    held: tuple[tuple[int, int], ...]
    age_s: float
    name: str | None = None
    command: str | None = None
    watched: bool = False  # the server has sampled the GPUs: ``used_mib`` is sent
    used_mib: int | None = None  # GPU memory its processes hold (None: some unknown)
    over_lease: bool = False  # flagged over its allowance on some GPU
    allowed_mib: int | None = None  # its allowance over its GPUs, sent with over_lease

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.id, "uid": self.uid, "pid": self.pid,
            "held": [list(p) for p in self.held], "age_s": round(self.age_s, 6),
        }  # fmt: skip
        _put_texts(out, self.name, self.command)
        if self.watched:
            out["used_mib"] = self.used_mib
        if self.over_lease:
            out["over_lease"] = True
            out["allowed_mib"] = self.allowed_mib
        return out


@dataclass(frozen=True, slots=True)
class WaiterRecord:
    """One waiting request in a status reply, in queue order, with its reservation;
    ``held``: why its owner's limits hold it (the server's ``[limits]``), if they do;
    ``account``: the account its uid is scheduled under (the server's ``[accounts]``), if
    any. ``reason``: why it waits (one of ``hwpool._core._explain.Reason``'s values), with
    ``reason_detail`` in words, and ``estimated_start``: when it is expected to start (wall
    clock, seconds since the epoch; None: unknown); an older server sends none of them."""

    id: int
    uid: int
    pid: int
    count: int
    units: int
    reserved: tuple[int, ...]
    age_s: float
    name: str | None = None
    command: str | None = None
    unit: Unit = "gpu"
    held: str | None = None
    account: str | None = None
    reason: str | None = None
    reason_detail: str | None = None
    estimated_start: float | None = None

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "id": self.id, "uid": self.uid, "pid": self.pid, "count": self.count,
            "units": self.units, "reserved": list(self.reserved), "age_s": round(self.age_s, 6),
        }  # fmt: skip
        _put_texts(out, self.name, self.command)
        if self.unit != "gpu":
            out["unit"] = self.unit
        if self.held is not None:
            out["held"] = self.held
        if self.account is not None:
            out["account"] = self.account
        if self.reason is not None:
            out["reason"] = self.reason
            out["reason_detail"] = self.reason_detail or ""
            start = self.estimated_start
            out["estimated_start"] = None if start is None else round(start, 3)
        return out


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """One owner (a uid) in a status reply: its share, its recent usage (GPU-seconds, decayed
    with the server's half-life), the GPUs it holds now and how many of its requests wait."""

    uid: int
    share: float
    usage_gpu_s: float
    running: float
    queued: int

    def wire(self) -> dict[str, object]:
        return {
            "uid": self.uid, "share": self.share, "usage_gpu_s": round(self.usage_gpu_s, 6),
            "running": round(self.running, 6), "queued": self.queued,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class AccountRecord:
    """One account in a status reply (an owner of the server's ``[accounts]``: users who are
    scheduled as one), as :class:`OwnerRecord` counts a uid: its share, its members' recent
    usage together, the GPUs they hold now and how many of their requests wait."""

    account: str
    share: float
    usage_gpu_s: float
    running: float
    queued: int

    def wire(self) -> dict[str, object]:
        return {
            "account": self.account, "share": self.share,
            "usage_gpu_s": round(self.usage_gpu_s, 6), "running": round(self.running, 6),
            "queued": self.queued,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class WatchRecord:
    """The server's GPU watcher in a status reply: where it reads (``source``), how often,
    how long ago its last sample was taken (None: none yet) and what failed in it."""

    source: str
    interval_s: float
    age_s: float | None
    problem: str = ""

    def wire(self) -> dict[str, object]:
        age = None if self.age_s is None else round(self.age_s, 6)
        return {"source": self.source, "interval_s": self.interval_s, "age_s": age,
                "problem": self.problem}  # fmt: skip


@dataclass(frozen=True, slots=True)
class GPUStateRecord:
    """One GPU's live state in a status reply (MiB; None: unknown), and the memory outside
    the queue the server withholds from what it shares there."""

    gpu: int
    uuid: str
    total_mib: int | None
    used_mib: int | None
    utilization: int | None
    withheld_mib: int

    def wire(self) -> dict[str, object]:
        return {
            "gpu": self.gpu, "uuid": self.uuid, "total_mib": self.total_mib,
            "used_mib": self.used_mib, "utilization": self.utilization,
            "withheld_mib": self.withheld_mib,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class OutsideRecord:
    """A process on a GPU outside the queue: host pid, its uid and user name (None and ""
    when it was gone before it was read), the GPU's index and its memory (None: unknown)."""

    pid: int
    uid: int | None
    user: str
    gpu: int
    used_mib: int | None

    def wire(self) -> dict[str, object]:
        return {"pid": self.pid, "uid": self.uid, "user": self.user, "gpu": self.gpu,
                "used_mib": self.used_mib}  # fmt: skip


MAX_OUTSIDE = 64
"""The most processes outside the queue a status reply lists (the most memory first)."""

MAX_OWNERS = 256
"""The most owners (uids and accounts together) a status reply lists (those with the most
running, then queued, first): so that they always fit in the one ``status`` line, however
many users there are."""

MAX_ACCOUNT_NAME = 64
"""The longest account name a status reply carries (the server's config allows no longer)."""


@dataclass(frozen=True, slots=True)
class StatusReply:
    """The host's state: free units per GPU, leases, the queue in order, the counters.

    ``recovering_s`` is the time left in the grace period after a restart (0 when serving).
    ``leases_left_out`` and ``waiting_left_out`` count the records a one-line answer (to a
    status without ``stream``) had no room for: the last ones of each list.
    ``journal_error``: why the server cannot write its journal now (it grants nothing new
    until it can), or None; sent only when set (older servers never send it).
    ``owners``: each uid with a lease, a waiter or a configured share, and ``accounts``:
    each account (of the server's ``[accounts]``) likewise, at most MAX_OWNERS of both
    together (``owners_left_out`` counts the rest); sent only when there are some (older
    servers never send them; an older client ignores ``accounts``).
    """

    req: int
    free: tuple[int, ...]
    leases: Sequence[LeaseRecord]  # a tuple, except on the server (built as it is sent)
    waiting: Sequence[WaiterRecord]
    granted: int
    released: int
    cancelled: int
    timed_out: int
    recovering_s: float
    uptime_s: float
    leases_left_out: int = 0
    waiting_left_out: int = 0
    journal_error: str | None = None
    owners: tuple[OwnerRecord, ...] = ()
    owners_left_out: int = 0
    accounts: tuple[AccountRecord, ...] = ()
    watch: WatchRecord | None = None
    gpu_state: tuple[GPUStateRecord, ...] = ()
    outside: tuple[OutsideRecord, ...] = ()
    outside_left_out: int = 0
    ended_for_overuse: int = 0
    op: ClassVar[str] = "status"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {
            "op": self.op, "req": self.req, "free": list(self.free),
            "leases": [lease.wire() for lease in self.leases],
            "waiting": [waiter.wire() for waiter in self.waiting],
            "granted": self.granted, "released": self.released, "cancelled": self.cancelled,
            "timed_out": self.timed_out, "recovering_s": round(self.recovering_s, 6),
            "uptime_s": round(self.uptime_s, 6),
        }  # fmt: skip
        if self.leases_left_out or self.waiting_left_out:
            out["leases_left_out"] = self.leases_left_out
            out["waiting_left_out"] = self.waiting_left_out
        if self.journal_error is not None:
            out["journal_error"] = self.journal_error
        if self.owners or self.owners_left_out or self.accounts:
            out["owners"] = [owner.wire() for owner in self.owners]
            out["owners_left_out"] = self.owners_left_out
        if self.accounts:
            out["accounts"] = [account.wire() for account in self.accounts]
        if self.watch is not None:
            out["watch"] = self.watch.wire()
            out["gpu_state"] = [gpu.wire() for gpu in self.gpu_state]
            out["outside"] = [process.wire() for process in self.outside]
        if self.outside_left_out:
            out["outside_left_out"] = self.outside_left_out
        if self.ended_for_overuse:
            out["ended_for_overuse"] = self.ended_for_overuse
        return out


@dataclass(frozen=True, slots=True)
class StatusPart:
    """Part of a streamed status answer: more leases and waiters, in order, before the
    ``status`` line that ends the answer (whose own lists come after these)."""

    req: int
    leases: tuple[LeaseRecord, ...]
    waiting: tuple[WaiterRecord, ...]
    op: ClassVar[str] = "status_part"

    def wire(self) -> dict[str, object]:
        return {
            "op": self.op, "req": self.req, "leases": [lease.wire() for lease in self.leases],
            "waiting": [waiter.wire() for waiter in self.waiting],
        }  # fmt: skip


ServerMessage = (
    Welcome
    | Granted
    | Queued
    | Busy
    | Done
    | Revoked
    | ErrorReply
    | StatusReply
    | StatusPart
    | Given
    | Notice
)


# ----------------------------------------------------------------- status in parts
_PART_ROOM = MAX_LINE - 256
"""What the records of one ``status_part`` line may take; the rest is for its other fields."""


def _record_bytes(record: LeaseRecord | WaiterRecord) -> bytes:
    return _ENCODER.encode(record.wire()).encode()


def status_lines(reply: StatusReply, stream: bool) -> Iterator[bytes]:
    """The lines that answer a status with ``reply``, each at most MAX_LINE bytes.

    With ``stream``: ``status_part`` lines holding the leases, then the waiters, in order, as
    many per line as fit, and last the ``status`` line with the free units and counters (and
    empty lists). Without: one ``status`` line, its lists cut to fit and the cut counted in
    its ``*_left_out`` fields. A generator that encodes each record once, when its line is
    asked for, so a server holds one line of a long answer at a time. Any one record fits
    in a line (``name`` and ``command`` are at most MAX_TEXT characters each).
    """
    if stream:
        yield from _parts(reply.req, reply.leases, reply.waiting)
        yield encode(_cut(reply, len(reply.leases), len(reply.waiting), 0, 0))
        return
    room = MAX_LINE - len(encode(_cut(reply, 0, 0, len(reply.leases), len(reply.waiting))))
    kept = []
    for records in (reply.leases, reply.waiting):
        count = 0
        for record in records:
            size = len(_record_bytes(record)) + 1
            if size > room:
                room = 0  # what follows a record that did not fit stays out too
                break
            room -= size
            count += 1
        kept.append(count)
    left_out = len(reply.leases) - kept[0], len(reply.waiting) - kept[1]
    yield encode(_cut(reply, 0, 0, *left_out))


def _parts(
    req: int, leases: Sequence[LeaseRecord], waiting: Sequence[WaiterRecord]
) -> Iterator[bytes]:
    """The ``status_part`` lines that carry ``leases`` and ``waiting``, each as full as fits
    (the records are read one by one, as the lines are asked for)."""
    chunks: tuple[list[bytes], list[bytes]] = ([], [])
    size = 0
    records: Iterator[tuple[int, LeaseRecord | WaiterRecord]] = itertools.chain(
        ((0, r) for r in leases), ((1, r) for r in waiting)
    )
    for kind, record in records:
        data = _record_bytes(record)
        if size + len(data) + 1 > _PART_ROOM and size:
            yield _part_line(req, *chunks)
            chunks, size = ([], []), 0
        chunks[kind].append(data)
        size += len(data) + 1
    if size:
        yield _part_line(req, *chunks)


def _part_line(req: int, leases: list[bytes], waiting: list[bytes]) -> bytes:
    """One ``status_part`` line (as ``StatusPart.wire`` has it) from encoded records."""
    return b"".join(
        (b'{"op":"status_part","req":', str(req).encode(), b',"leases":[', b",".join(leases),
         b'],"waiting":[', b",".join(waiting), b"]}\n")
    )  # fmt: skip


def _cut(
    reply: StatusReply, lease_at: int, waiter_at: int, leases_out: int, waiting_out: int
) -> StatusReply:
    """``reply`` with the records from ``lease_at`` and ``waiter_at`` on, less the last
    ``leases_out`` and ``waiting_out`` of them (counted as left out)."""
    return dataclasses.replace(
        reply,
        leases=reply.leases[lease_at : len(reply.leases) - leases_out],
        waiting=reply.waiting[waiter_at : len(reply.waiting) - waiting_out],
        leases_left_out=leases_out,
        waiting_left_out=waiting_out,
    )


def join_status(parts: Iterable[StatusPart], last: StatusReply) -> StatusReply:
    """The whole answer from its ``status_part`` lines and the ``status`` that ended it."""
    leases: list[LeaseRecord] = []
    waiting: list[WaiterRecord] = []
    for part in parts:
        leases += part.leases
        waiting += part.waiting
    if not leases and not waiting:
        return last
    return dataclasses.replace(
        last, leases=(*leases, *last.leases), waiting=(*waiting, *last.waiting)
    )


def _welcome(f: _Fields) -> Welcome:
    gpus = tuple(
        GPUInfo(g.num("index", 0, MAX_GPUS - 1), g.text("device_id", 256), g.opt_text("uuid"),
                g.opt_num("memory_mib"), g.opt_text("name"), g.opt_text("parent"))
        for g in f.objects("gpus")
    )  # fmt: skip
    if not gpus or [g.index for g in gpus] != list(range(len(gpus))):
        raise f.fail("gpus must list GPUs 0..n-1 in order")
    totals = None
    if f.obj.get("totals") is not None:
        totals = f.ints("totals", MAX_ID)
        if len(totals) != len(gpus) or 0 in totals:
            raise f.fail(f"totals must give each of the {len(gpus)} GPUs >= 1 MiB, got {totals}")
    return Welcome(
        f.num("version"), f.text("server", 256), f.num("pid"), f.num("uid"),
        f.num("units_per_gpu", 1), gpus, f.flag("recovering"), totals,
    )  # fmt: skip


_CANCELLED: dict[object, Literal["lease", "waiter"] | None] = {
    None: None, "lease": "lease", "waiter": "waiter",
}  # fmt: skip


def _done(f: _Fields) -> Done:
    what = f.obj.get("cancelled")
    if isinstance(what, (str, type(None))) and what in _CANCELLED:
        return Done(f.num("req"), _CANCELLED[what])
    raise f.fail(f"cancelled must be 'lease' or 'waiter', got {what!r}")


def _error(f: _Fields) -> ErrorReply:
    raw = f.text("code", 64)
    try:
        code = ErrorCode(raw)
    except ValueError:
        raise f.fail(f"unknown error code {raw!r}") from None
    return ErrorReply(f.opt_num("req"), code, f.text("message", MAX_LINE))


def _lease_record(f: _Fields) -> LeaseRecord:
    over = f.opt_flag("over_lease")
    return LeaseRecord(
        f.num("id"), f.num("uid"), f.num("pid"), f.pairs("held"), f.age("age_s"), **_texts(f),
        watched="used_mib" in f.obj, used_mib=f.opt_num("used_mib"), over_lease=over,
        allowed_mib=f.opt_num("allowed_mib") if over else None,
    )  # fmt: skip


def _watch_record(f: _Fields) -> WatchRecord | None:
    """The optional ``watch`` of a status reply."""
    raw = f.obj.get("watch")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise f.fail(f"watch must be an object, got {raw!r:.80}")
    w = _Fields(raw, f.op, f.req)
    age = None if raw.get("age_s") is None else w.age("age_s")
    return WatchRecord(w.text("source", 64), w.age("interval_s"), age, w.text("problem"))


def _opt_percent(f: _Fields, key: str) -> int | None:
    return f.opt_num(key, 0, 100)


def _gpu_state(f: _Fields) -> GPUStateRecord:
    return GPUStateRecord(
        f.num("gpu", 0, MAX_GPUS - 1), f.text("uuid", 256), f.opt_num("total_mib"),
        f.opt_num("used_mib"), _opt_percent(f, "utilization"), f.num("withheld_mib"),
    )  # fmt: skip


def _outside(f: _Fields) -> OutsideRecord:
    return OutsideRecord(
        f.num("pid"), f.opt_num("uid", 0, 2**32 - 1), f.text("user", 256),
        f.num("gpu", 0, MAX_GPUS - 1), f.opt_num("used_mib"),
    )  # fmt: skip


def _waiter_record(f: _Fields) -> WaiterRecord:
    return WaiterRecord(
        f.num("id"), f.num("uid"), f.num("pid"), f.num("count", 1, MAX_GPUS), f.num("units", 1),
        f.ints("reserved"), f.age("age_s"), **_texts(f), unit=_unit(f),
        held=f.opt_text("held"), account=_opt_account(f), reason=f.opt_text("reason"),
        reason_detail=f.opt_text("reason_detail"),
        estimated_start=None if f.obj.get("estimated_start") is None
        else f.age("estimated_start"),
    )  # fmt: skip


def _taken_request(f: _Fields) -> TakenRequest | None:
    """The optional ``request`` of a ``granted`` (an answer to a ``take``)."""
    if f.obj.get("request") is None:
        return None
    raw = f.get("request")
    if not isinstance(raw, dict):
        raise f.fail(f"request must be an object, got {raw!r:.80}")
    r = _Fields(raw, f.op, f.req)
    return TakenRequest(
        r.num("count", 1, MAX_GPUS), r.num("units", 1), r.age("age_s"), _unit(r), _limit(r),
        **_texts(r),
    )  # fmt: skip


def _opt_account(f: _Fields) -> str | None:
    return None if f.obj.get("account") is None else f.text("account", MAX_ACCOUNT_NAME)


def _status(f: _Fields) -> StatusReply:
    return StatusReply(
        f.num("req"), f.ints("free", MAX_ID),
        tuple(_lease_record(x) for x in f.objects("leases")),
        tuple(_waiter_record(x) for x in f.objects("waiting")),
        f.num("granted"), f.num("released"), f.num("cancelled"), f.num("timed_out"),
        f.age("recovering_s"), f.age("uptime_s"),
        f.opt_num("leases_left_out") or 0, f.opt_num("waiting_left_out") or 0,
        f.opt_text("journal_error"),
        tuple(_owner_record(x) for x in f.objects("owners")) if "owners" in f.obj else (),
        f.opt_num("owners_left_out") or 0,
        tuple(_account_record(x) for x in f.objects("accounts")) if "accounts" in f.obj else (),
        _watch_record(f),
        tuple(_gpu_state(x) for x in f.objects("gpu_state")) if "gpu_state" in f.obj else (),
        tuple(_outside(x) for x in f.objects("outside")) if "outside" in f.obj else (),
        f.opt_num("outside_left_out") or 0, f.opt_num("ended_for_overuse") or 0,
    )  # fmt: skip


def _owner_record(f: _Fields) -> OwnerRecord:
    return OwnerRecord(
        f.num("uid"), _share(f), f.age("usage_gpu_s"), f.age("running"), f.num("queued")
    )


def _account_record(f: _Fields) -> AccountRecord:
    return AccountRecord(
        f.text("account", MAX_ACCOUNT_NAME), _share(f), f.age("usage_gpu_s"), f.age("running"),
        f.num("queued"),
    )  # fmt: skip


def _share(f: _Fields) -> float:
    share = f.age("share")
    if not share > 0:
        raise f.fail(f"share must be a finite number > 0, got {share!r}")
    return share


def _status_part(f: _Fields) -> StatusPart:
    return StatusPart(
        f.num("req"), tuple(_lease_record(x) for x in f.objects("leases")),
        tuple(_waiter_record(x) for x in f.objects("waiting")),
    )  # fmt: skip


_SERVER: dict[str, Callable[[_Fields], ServerMessage]] = {
    "welcome": _welcome,
    "granted": lambda f: Granted(
        f.num("req"), f.num("id", 1), f.ints("gpus"), f.num("units"), _taken_request(f)
    ),
    "given": lambda f: Given(f.num("req"), f.num("id", 1), _ticket(f)),
    "queued": lambda f: Queued(f.num("req"), f.num("id", 1)),
    "would_block": lambda f: Busy(f.num("req")),
    "ok": _done,
    "revoked": _revoked,
    "error": _error,
    "status": _status,
    "status_part": _status_part,
    "notice": lambda f: Notice(f.num("req"), f.num("id", 1), f.text("text")),
}


def decode_server(line: bytes) -> ServerMessage:
    """Validate one line from the server; raise ProtocolError saying what is wrong."""
    f = _opened(line, "server")
    parse = _SERVER.get(f.op)
    if parse is None:
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {f.op[:64]!r}", f.req)
    return parse(f)
