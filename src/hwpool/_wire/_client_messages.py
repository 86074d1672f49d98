"""What a client sends: one frozen dataclass per request (``wire()`` gives its JSON object),
:func:`decode_client`, which validates a line from a client into one of them, and
:func:`request_for`, the request that asks for a :class:`Demand` on a given server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from .._core._scheduler import Demand
from ._bounds import MAX_PRIORITY, MAX_REASON
from ._fields import _Fields, _limit, _opened, _put_texts, _texts, _ticket, _unit
from ._framing import MAX_GPUS, TOKEN, ErrorCode, ProtocolError, Role, Unit


def request_for(demand: Demand, sized: bool, units_per_gpu: int) -> tuple[int, int, Unit]:
    """``count``, ``units`` and ``unit`` of the request that asks for ``demand``, on a server
    sized in memory (``sized``) or not: MiB for an amount of one GPU's memory, else a share
    of a GPU (relative or whole) in ``units_per_gpu`` units."""
    if not sized or demand.relative:
        return demand.count, demand.units, "gpu"
    if demand.whole or demand.count > 1:
        return demand.count, units_per_gpu, "gpu"
    return 1, demand.units, "mib"


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


@dataclass(frozen=True, slots=True)
class Drain:
    """Drain GPUs ``gpus`` (none: the whole server) for ``reason``, or (``resume``) end their
    drain: nothing new is granted on a drained GPU, leases there run to their end (admins
    only; answered ``done``). ``reason``: printable, at most ``MAX_REASON`` characters."""

    req: int
    gpus: tuple[int, ...] = ()
    reason: str = ""
    resume: bool = False
    op: ClassVar[str] = "drain"

    def wire(self) -> dict[str, object]:
        out: dict[str, object] = {"op": self.op, "req": self.req, "gpus": list(self.gpus)}
        if self.reason:
            out["reason"] = self.reason
        if self.resume:
            out["resume"] = True
        return out


ClientMessage = (
    Hello
    | Acquire
    | Withdraw
    | Release
    | Reclaim
    | Reclaimed
    | Status
    | Cancel
    | Bye
    | Give
    | Take
    | Drain
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


def _drain(f: _Fields) -> Drain:
    gpus = () if f.obj.get("gpus") is None else f.ints("gpus")
    twice = sorted({gpu for gpu in gpus if gpus.count(gpu) > 1})
    if twice:
        raise f.fail(f"gpus names GPU {twice[0]} more than once")
    reason = "" if f.obj.get("reason") is None else f.text("reason", MAX_REASON)
    if not reason.isprintable():
        raise f.fail(f"reason must be printable text (no control characters), got {reason!r:.80}")
    return Drain(f.num("req"), gpus, reason, f.opt_flag("resume"))


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
    "drain": _drain,
}


def decode_client(line: bytes) -> ClientMessage:
    """Validate one line from a client; raise ProtocolError saying what is wrong."""
    f = _opened(line, "client")
    parse = _CLIENT.get(f.op)
    if parse is None:
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {f.op[:64]!r}", f.req)
    return parse(f)
