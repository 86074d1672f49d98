"""What the server sends besides a status: one frozen dataclass per message (``wire()`` gives
its JSON object), and :func:`decode_server`, which validates any line from the server
(status answers included) into one of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

from .._host._detect import GPUInfo
from ._bounds import MAX_ID, MAX_TEXT
from ._fields import _Fields, _limit, _opened, _put_texts, _texts, _ticket, _unit
from ._framing import MAX_GPUS, MAX_LINE, ErrorCode, ErrorReply, ProtocolError, Unit
from ._status_records import StatusPart, StatusReply, _status, _status_part


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
