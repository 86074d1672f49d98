"""``hwpool status`` and ``hwpool cancel``: the host-wide GPU queue, seen and trimmed.

Each command reports its own errors in one line (``hwpool: error: ...``): exit 2 for bad usage
or a request the server refuses (an unknown id, someone else's lease), 1 when no server can be
reached, 0 otherwise. Whatever another user wrote (a job's name, a command line, a user name)
is shown through :func:`printable`, so it can neither drive the terminal nor forge a line.
``hwpool serve`` and ``top`` report their errors the same way, through
:func:`_host_access.guarded`; the status as data is ``_status_report``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

from .._core._memory import format_mib
from .._wire._connection import Wire
from ._host_access import Record, Usage, cancel_one, guarded, socket_of
from ._status_report import status_report
from ._text import one_line, printable
from ._waitwhy import wait_words

__all__ = ["ID_NOTE", "cmd_cancel", "cmd_status"]


# ----------------------------------------------------------------- status and cancel
def _cmd_status(args: argparse.Namespace) -> int:
    wire = Wire(socket_of(args), role="control")  # it works even at the cap on connections
    try:
        reply = wire.status()
    finally:
        wire.shutdown()
    report = status_report(wire, reply)
    print(json.dumps(report, indent=2) if args.json else _format(report))
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel each id named, and each request ``--name``/``--mine`` select; one line per id
    on what happened. Exit 2 if any was refused (unknown, or not the caller's)."""
    if not args.ids and args.name is None and not args.mine:
        raise Usage("cancel: give the ids to cancel, --name NAME or --mine (an id: j12 is "
                     "a job's, 12 a server request's)")  # fmt: skip
    ids = list(dict.fromkeys(i for i in args.ids if isinstance(i, int)))
    jobs = list(dict.fromkeys(i for i in args.ids if isinstance(i, str)))
    unfinished = 0
    if jobs:  # the job table only when job ids are given: status and cancel N never load it
        from ._job_table import CancelRefused, cancel_jobs  # noqa: PLC0415

        try:
            unfinished = cancel_jobs(jobs)
        except CancelRefused as exc:
            print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
            return exc.status
    if not ids and args.name is None and not args.mine:
        return 1 if unfinished else 0
    status = _cancel_requests(args, ids)
    return status or (1 if unfinished else 0)


def _cancel_requests(args: argparse.Namespace, ids: list[int]) -> int:
    """Cancel the server requests ``ids`` and those ``--name``/``--mine`` select."""
    wire = Wire(socket_of(args), role="control")  # it works even at the cap on connections
    try:
        reply = wire.status()
        known: dict[int, Record] = {r.id: r for r in reply.leases}
        known.update((w.id, w) for w in reply.waiting)
        if args.name is not None or args.mine:
            admin = os.getuid() in (0, wire.welcome.uid)
            chosen = _chosen(known.values(), admin, args.name, args.mine)
            if not chosen:
                print(f"hwpool cancel: nothing to cancel: {_selection(args, admin)}")
            ids += [i for i in chosen if i not in ids]
        refused = 0
        for req, ident in enumerate(ids, 1):
            line, ok = cancel_one(wire, req, ident, known.get(ident))
            refused += not ok
            print(line if ok else f"hwpool: error: {line}", file=sys.stdout if ok else sys.stderr)
    finally:
        wire.shutdown()
    return 2 if refused else 0


def _chosen(records: Iterable[Record], admin: bool, name: str | None, mine: bool) -> list[int]:
    """The ids ``--name``/``--mine`` select, in id order: the caller's own requests (with
    ``--name`` and no ``--mine``, an ``admin``'s selection takes in everyone's)."""
    me = os.getuid()
    return sorted(
        r.id
        for r in records
        if (r.uid == me or (admin and not mine)) and (name is None or r.name == name)
    )


def _selection(args: argparse.Namespace, admin: bool) -> str:
    """What ``--name``/``--mine`` found nothing for, in words (``no request of yours named
    'x'``)."""
    named = "" if args.name is None else f" named {printable(repr(args.name))}"
    mine = " of yours" if args.mine or not admin else ""
    return f"no request{mine}{named}"


def _held(lease: dict[str, Any]) -> str:
    held = lease["held"]
    if all(f == 1.0 for _, f in held):
        gpus = ",".join(str(int(g)) for g, _ in held)
        return f"GPU {gpus}" if len(held) == 1 else f"GPUs {gpus}"
    if lease["held_mib"] is not None:
        return ", ".join(f"{format_mib(mib)} of GPU {g}" for g, mib in lease["held_mib"])
    return ", ".join(f"{f:g} of GPU {int(g)}" for g, f in held)


def _gpu_line(gpu: dict[str, Any]) -> str:
    """One GPU: its index, free share and the device a job granted it sees (its UUID, or
    MIG id, in CUDA_VISIBLE_DEVICES; the index on a host without them)."""
    device = printable(gpu["device"])
    if gpu["free_mib"] is None:
        return f"{gpu['index']:>3}  {gpu['free']:.2f}  {device}"
    size = f"{format_mib(gpu['free_mib'])} of {format_mib(gpu['total_mib'])}"
    line = f"{gpu['index']:>3}  {gpu['free']:.2f}  {size:<20} {device}"
    used = gpu["in_use_mib"]
    return line if used is None else f"{line}  ({format_mib(used)} in use now, all processes)"


def _live_line(gpu: dict[str, Any]) -> str:
    """``  (now: 9GiB of 16GiB used, 37% busy, 4GiB used outside the queue withheld)``: what
    the server's GPU watch read last."""
    live = gpu["live"]
    if live is None or all(live[k] is None for k in ("used_mib", "total_mib", "utilization")):
        return ""  # nothing read (the watch's line says why)

    def mib(value: int | None) -> str:
        return "?" if value is None else format_mib(value)

    busy = "?" if live["utilization"] is None else f"{live['utilization']}%"
    withheld = live["withheld_mib"]
    return (
        f"  (now: {mib(live['used_mib'])} of {mib(live['total_mib'])} used, {busy} busy"
        + (f", {format_mib(withheld)} used outside the queue withheld" if withheld else "")
        + ")"
    )


def _draining(reason: str) -> str:
    """``draining: driver update`` (escaped), or ``draining`` where no reason was given."""
    return f"draining: {printable(reason)}" if reason else "draining (no reason given)"


def _gpu_drain(gpu: dict[str, Any], server: dict[str, Any]) -> str:
    """``  draining: fan noise`` for a GPU drained on its own (the whole server's drain is
    said once, on its own line)."""
    reason = gpu.get("draining")
    if reason is None or server.get("draining") is not None:
        return ""
    return f"  {_draining(reason)}"


def _asked(waiter: dict[str, Any]) -> str:
    if waiter["count"] > 1:
        return f"{waiter['count']} whole GPUs"
    if waiter["memory_mib"] is not None:
        return format_mib(waiter["memory_mib"])
    return "1 whole GPU" if waiter["fraction"] == 1 else f"{waiter['fraction']:g} of a GPU"


def _label(item: dict[str, Any]) -> str:
    """``  [name | command]``, escaped; the server leaves out other users' command lines."""
    parts = [printable(p) for p in (item["name"], item["command"]) if p]
    return f"  [{' | '.join(parts)}]" if parts else ""


ID_NOTE = (
    "(#N: the server's lease and request ids, for `hwpool cancel N`; the jobs of `hwpool "
    "submit` are jN: `hwpool jobs`, `hwpool cancel jN`)"
)


def _format(report: dict[str, Any]) -> str:
    """The status as text: every string another user could have chosen goes through
    ``printable`` (names, command lines, user names, device ids, the socket path)."""
    server = report["server"]
    lines = [
        f"hwpool server on {printable(report['socket'])}: pid {server['pid']}, "
        f"user {printable(server['user'])}, up {server['uptime_s']:.0f} s, "
        f"{printable(server['version'])}"
    ]
    if server["recovering_s"]:
        lines.append(
            f"recovering after a restart: nothing new is granted for {server['recovering_s']:.1f}"
            " s more, while clients reclaim their leases"
        )
    if server["journal_error"] is not None:
        lines.append(f"journal not writable: nothing new is granted ({server['journal_error']})")
    if server.get("draining") is not None:
        lines.append(
            f"{_draining(server['draining'])}: nothing new is granted, leases run to their "
            "end (`hwpool resume` ends it)"
        )
    sized = report["sized_in_memory"]
    lines.append("GPU  free  memory free          device" if sized else "GPU  free  device")
    lines += [_gpu_line(g) + _live_line(g) + _gpu_drain(g, server) for g in report["gpus"]]
    lines.append(f"leases ({len(report['leases'])}):")
    lines += [
        f"  #{x['id']} {printable(x['user'])} pid {x['pid']}: {_held(x)}, "
        f"held {x['held_s']:.1f} s" + _use(x, report["watch"] is not None) + _label(x)
        for x in report["leases"]
    ]
    lines.append(f"queue ({len(report['waiting'])}, in order):")
    for w in report["waiting"]:
        what = _asked(w)
        reserve = f", reserves GPU {','.join(map(str, w['reserved']))}" if w["reserved"] else ""
        held = f", held: {printable(w['held'])}" if w["held"] else ""
        lines.append(
            f"  {w['position']}. #{w['id']} {printable(w['user'])}{_in_account(w)} pid "
            f"{w['pid']}: {what}"
            f"{reserve}{held}, waiting {w['waited_s']:.1f} s" + _label(w) + _why(w)
        )
    lines += _outside_lines(report)
    lines += _owner_lines(report["owners"], report["owners_left_out"])
    c = report["counters"]
    lines.append(
        f"granted {c['granted']}, released {c['released']}, cancelled {c['cancelled']}, "
        f"timed out {c['timed_out']}"
        + (f", ended for overuse {c['ended_for_overuse']}" if c["ended_for_overuse"] else "")
    )
    if report["leases"] or report["waiting"]:
        lines.append(ID_NOTE)
    return "\n".join(lines)


def _why(waiter: dict[str, Any]) -> str:
    """`` -- priority: 1 waiting ahead ...; start unknown``: why it waits, from the server."""
    words = wait_words(waiter)
    return f" -- {words}" if words else ""


def _use(lease: dict[str, Any], watched: bool) -> str:
    """``, uses 5 GiB OVER its 2 GiB``: a lease's GPU memory, where the server watches."""
    if not watched:
        return ""
    used = "?" if lease["used_mib"] is None else format_mib(lease["used_mib"])
    if lease["over_lease"]:
        return f", uses {used} OVER its {format_mib(lease['allowed_mib'] or 0)}"
    return f", uses {used}"


def _outside_lines(report: dict[str, Any]) -> list[str]:
    """The processes on the GPUs outside the queue (where the server watches), for an admin."""
    if report["watch"] is None:
        return []
    outside, more = report["outside"], report["outside_left_out"]
    problem = report["watch"]["problem"]
    lines = [f"GPU watch ({printable(report['watch']['source'] or 'starting')}): "
             f"{printable(problem)}"] if problem else []  # fmt: skip
    lines.append(f"outside the queue ({len(outside) + more}):")
    lines += [
        f"  pid {o['pid']} {printable(o['user'] or '?')}: "
        f"{'?' if o['used_mib'] is None else format_mib(o['used_mib'])} of GPU {o['gpu']}"
        for o in outside
    ]
    if more:
        lines.append(f"  ... and {more} more")
    return lines


def _in_account(waiter: dict[str, Any]) -> str:
    """`` (account ml)`` for a waiter of a user scheduled in an account; else nothing."""
    account = waiter["account"]
    return "" if account is None else f" (account {printable(account)})"


def _owner_lines(owners: list[dict[str, Any]], left_out: int) -> list[str]:
    """The owners table: each user's or account's share, recent usage (GPU-seconds,
    decayed), GPUs held now and requests waiting; the queue is fair between them by usage
    per share."""
    if not owners:
        return []
    more = f", {left_out} more not shown" if left_out else ""
    lines = [f"owners ({len(owners)}{more}; usage: GPU-seconds, decayed):",
             "  user                      share      usage  running  queued"]  # fmt: skip
    lines += [
        f"  {_owner_name(o):<24}  {o['share']:>5g}  {o['usage_gpu_s']:>9.1f}"
        f"  {o['running']:>7.2f}  {o['queued']:>6}"
        for o in owners
    ]
    return lines


def _owner_name(owner: dict[str, Any]) -> str:
    """A user's name, or ``account ml`` (escaped)."""
    if owner["account"] is not None:
        return f"account {printable(owner['account'])}"
    return printable(owner["user"])


cmd_status = guarded(_cmd_status)
cmd_cancel = guarded(_cmd_cancel)
