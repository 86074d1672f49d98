"""The answer to a ``status``: :class:`StatusReply`, the records it lists (leases, waiters,
owners and accounts, the watcher, each GPU's live state, processes outside the queue), the
``status_part`` lines that carry a long answer, the caps that keep one line small, and the
decoding of each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ._bounds import MAX_ID, MAX_REASON
from ._fields import _Fields, _put_texts, _texts, _unit
from ._framing import MAX_GPUS, Unit


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
    ``draining``: the reason the whole server is drained (nothing new is granted), or None;
    ``drained_gpus``: each GPU drained on its own, ``(index, reason)``; sent only when set
    (older servers never send them).
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
    draining: str | None = None
    drained_gpus: tuple[tuple[int, str], ...] = ()
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
        if self.draining is not None:
            out["draining"] = self.draining
        if self.drained_gpus:
            out["drained_gpus"] = [{"gpu": g, "reason": r} for g, r in self.drained_gpus]
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
        None if f.obj.get("draining") is None else f.text("draining", MAX_REASON),
        tuple(_drained_gpu(x) for x in f.objects("drained_gpus"))
        if "drained_gpus" in f.obj else (),
    )  # fmt: skip


def _drained_gpu(f: _Fields) -> tuple[int, str]:
    return f.num("gpu", 0, MAX_GPUS - 1), f.text("reason", MAX_REASON)


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
