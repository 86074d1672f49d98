"""The host server's status as plain data: what ``hwpool status --json`` prints and its text
and ``hwpool top`` show (fractions of a GPU instead of units; MiB beside them on a server
sized in memory; the live GPU fields a watching server sends)."""

from __future__ import annotations

from typing import Any

from .._host._detect import GPUInfo, gpu_memory_in_use
from .._host._devices import device_id
from .._wire._connection import Wire
from .._wire._protocol import StatusReply
from ._host_access import user_name

__all__ = ["LEASE_WATCH_FIELDS", "WATCH_FIELDS", "report_of", "status_report"]


def status_report(wire: Wire, reply: StatusReply) -> dict[str, Any]:
    """The status as plain data, fractions of a GPU instead of units (for --json and text);
    on a server sized in memory, MiB beside them."""
    welcome, full, totals = wire.welcome, wire.welcome.units_per_gpu, wire.welcome.totals

    def share(gpu: int, units: int) -> float:
        return units / (full if totals is None else totals[gpu])

    in_use = _in_use_now(welcome.gpus) if totals is not None else (None,) * len(welcome.gpus)
    live = _live(reply)
    drained = dict(reply.drained_gpus)  # a GPU's own drain; else the server's (None: none)

    report = {
        "socket": str(wire.path),
        "server": {
            "pid": welcome.pid, "uid": welcome.uid, "user": user_name(welcome.uid),
            "version": welcome.server, "uptime_s": reply.uptime_s,
            "recovering_s": reply.recovering_s, "journal_error": reply.journal_error,
            "draining": reply.draining,
        },
        "sized_in_memory": totals is not None,
        "gpus": [
            {"index": g.index, "device": device_id(g), "device_id": g.device_id, "uuid": g.uuid,
             "name": g.name,
             "parent": g.parent, "memory_mib": g.memory_mib, "free": share(g.index, free),
             "free_mib": None if totals is None else free,
             "total_mib": None if totals is None else totals[g.index],
             "in_use_mib": in_use[g.index], "live": live.get(g.index),
             "draining": drained.get(g.index, reply.draining)}
            for g, free in zip(welcome.gpus, reply.free, strict=False)
        ],
        "leases": [
            {"id": x.id, "uid": x.uid, "user": user_name(x.uid), "pid": x.pid,
             "held": [[gpu, share(gpu, units)] for gpu, units in x.held],
             "held_mib": None if totals is None else [list(p) for p in x.held],
             "held_s": x.age_s, "name": x.name, "command": x.command,
             "used_mib": x.used_mib, "over_lease": x.over_lease, "allowed_mib": x.allowed_mib}
            for x in reply.leases
        ],
        "waiting": [
            {"position": n, "id": w.id, "uid": w.uid, "user": user_name(w.uid), "pid": w.pid,
             "count": w.count, "fraction": None if w.unit == "mib" else w.units / full,
             "memory_mib": w.units if w.unit == "mib" else None, "reserved": list(w.reserved),
             "waited_s": w.age_s, "name": w.name, "command": w.command, "held": w.held,
             "account": w.account, "reason": w.reason, "reason_detail": w.reason_detail,
             "estimated_start": w.estimated_start}
            for n, w in enumerate(reply.waiting, 1)
        ],
        "owners": _owners(reply),
        "owners_left_out": reply.owners_left_out,
        "counters": {
            "granted": reply.granted, "released": reply.released,
            "cancelled": reply.cancelled, "timed_out": reply.timed_out,
            "ended_for_overuse": reply.ended_for_overuse,
        },
        **_watched(reply),
    }  # fmt: skip
    return report


def _live(reply: StatusReply) -> dict[int, dict[str, Any]]:
    """Per GPU index, what the server's GPU watch read of it last (none: not watched)."""
    return {
        g.gpu: {"total_mib": g.total_mib, "used_mib": g.used_mib, "utilization": g.utilization,
                "withheld_mib": g.withheld_mib}
        for g in reply.gpu_state
    }  # fmt: skip


def _watched(reply: StatusReply) -> dict[str, Any]:
    """The server's GPU watch (None where it does not watch, or is older) and the processes
    on its GPUs outside the queue."""
    watch = reply.watch
    return {
        "watch": None if watch is None else {
            "source": watch.source, "interval_s": watch.interval_s, "age_s": watch.age_s,
            "problem": watch.problem,
        },
        "outside": [
            {"pid": o.pid, "uid": o.uid, "user": o.user, "gpu": o.gpu, "used_mib": o.used_mib}
            for o in reply.outside
        ],
        "outside_left_out": reply.outside_left_out,
    }  # fmt: skip


def _owners(reply: StatusReply) -> list[dict[str, Any]]:
    """The owners, uids and accounts together, the busiest first (as the server orders each
    list: most running, then most queued; uids before accounts on a tie)."""
    owners: list[dict[str, Any]] = [
        {"uid": o.uid, "user": user_name(o.uid), "account": None, "share": o.share,
         "usage_gpu_s": o.usage_gpu_s, "running": o.running, "queued": o.queued}
        for o in reply.owners
    ]  # fmt: skip
    owners += [
        {"uid": None, "user": None, "account": a.account, "share": a.share,
         "usage_gpu_s": a.usage_gpu_s, "running": a.running, "queued": a.queued}
        for a in reply.accounts
    ]  # fmt: skip
    owners.sort(key=lambda o: (-o["running"], -o["queued"], o["uid"] is None))
    return owners


def _in_use_now(gpus: tuple[GPUInfo, ...]) -> tuple[int | None, ...]:
    """The memory in use on each GPU now, by any process (NVML, else nvidia-smi), for a server
    sized in memory; None where it cannot be read (logical GPUs are not asked about)."""
    if all(g.uuid is None for g in gpus):
        return (None,) * len(gpus)
    return gpu_memory_in_use(gpus)


WATCH_FIELDS = ("watch", "gpu_state", "outside", "outside_left_out", "ended_for_overuse")
"""The live GPU fields a watching server adds to its status reply (docs/observability.md)."""


LEASE_WATCH_FIELDS = ("used_mib", "over_lease", "allowed_mib")
"""The same, on each lease record."""


def report_of(wire: Wire, reply: StatusReply) -> dict[str, Any]:
    """The status as plain data (as ``--json`` prints it), with the live GPU fields the
    server sent, where it sent them and the report does not carry them already: for
    ``hwpool top``, which shows them when present."""
    report = status_report(wire, reply)
    sent = reply.wire()
    for key in WATCH_FIELDS:
        if key in sent and key not in report:
            report[key] = sent[key]
    by_id = {lease["id"]: lease for lease in report["leases"]}
    records = sent["leases"]
    assert isinstance(records, list)
    for record in records:
        lease = by_id.get(record["id"])
        for key in LEASE_WATCH_FIELDS:
            if lease is not None and key in record and key not in lease:
                lease[key] = record[key]
    return report
