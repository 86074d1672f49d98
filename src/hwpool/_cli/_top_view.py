"""What ``hwpool top`` shows: a pure function of a status report and the screen's size.

:func:`render` turns the report of ``hwpool status --json`` (``_host_cmds``' plain data) into
at most ``height`` lines of at most ``width`` characters: a header, then per GPU its bars
(leased, and where the server watches its GPUs, memory in use and utilisation) and the leases
on it, the queue in order with why each request waits, and the processes outside the queue.
It reads no clock, terminal or socket, so that tests call it directly; ``_top`` is the shell
that fetches reports and draws these lines (curses on a terminal, plain prints otherwise).

The live GPU fields (``gpu_state``, ``outside``, a lease's ``used_mib`` and ``over_lease``;
see docs/observability.md) are optional: a server that does not watch its GPUs leaves them
out, and then their bars and rows are left out too. Every string another user chose (names,
user names, device ids) goes through :func:`printable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._core._memory import format_mib
from ._text import printable
from ._waitwhy import span as _duration
from ._waitwhy import wait_words

__all__ = ["bar", "render", "why_waiting"]

Report = Mapping[str, Any]

MIN_BAR = 8  # characters inside a bar's brackets, at the least
MAX_BAR = 30
EPSILON = 1e-9  # a share that is free to within rounding counts as free


def render(report: Report, width: int, height: int | None, note: str = "") -> list[str]:
    """The screen for ``report``: at most ``height`` lines (None: all of them) of at most
    ``width`` characters. ``note`` ends the header line (a key to quit, a connection error).
    When the lines do not fit, the last one says how many were left out."""
    width = max(width, 20)
    lines = _header(report, note)
    lines += _gpu_lines(report, width)
    lines += _queue_lines(report)
    lines += _outside_lines(report)
    lines = [_clip(line, width) for line in lines]
    if height is not None and len(lines) > height:
        kept = max(height - 1, 0)
        more = f"... {len(lines) - kept} more lines (a larger window shows them)"
        lines = [*lines[:kept], _clip(more, width)][: max(height, 0)]
    return lines


# ----------------------------------------------------------------- header
def _header(report: Report, note: str) -> list[str]:
    server, counters = report["server"], report["counters"]
    head = (
        f"hwpool top  {printable(report['socket'])}  server pid {server['pid']} "
        f"({printable(server['user'])}), up {_duration(server['uptime_s'])}"
    )
    lines = [f"{head}  {note}" if note else head]
    lines.append(
        f"leases {len(report['leases'])}, waiting {len(report['waiting'])}; granted "
        f"{counters['granted']}, released {counters['released']}, cancelled "
        f"{counters['cancelled']}, timed out {counters['timed_out']}"
    )
    if server.get("journal_error"):
        lines.append(f"! journal not writable, nothing new is granted: {server['journal_error']}")
    if server.get("recovering_s"):
        lines.append(
            f"! recovering after a restart: nothing new is granted for "
            f"{server['recovering_s']:.1f} s more"
        )
    if server.get("draining") is not None:
        lines.append(f"! draining, nothing new is granted: {printable(server['draining'])}")
    drained = [g for g in report["gpus"] if g.get("draining") is not None]
    if drained and server.get("draining") is None:
        lines += [f"! GPU {g['index']} draining: {printable(g['draining'])}" for g in drained]
    watch = report.get("watch")
    if isinstance(watch, Mapping) and watch.get("problem"):
        lines.append(f"! GPU watcher: {printable(str(watch['problem']))}")
    return lines


# ----------------------------------------------------------------- GPUs and their leases
def _gpu_lines(report: Report, width: int) -> list[str]:
    """Per GPU: a line of bars, then one line per lease on it."""
    states = _by_gpu(report.get("gpu_state"), "gpu")
    size = max(MIN_BAR, min(MAX_BAR, (width - 50) // 3))
    lines: list[str] = []
    for gpu in report["gpus"]:
        index = gpu["index"]
        lines.append(_gpu_head(gpu, states.get(index), size))
        for lease in report["leases"]:
            for held_gpu, fraction in lease["held"]:
                if int(held_gpu) == index:
                    lines.append(_lease_line(lease, int(held_gpu), fraction))
    return lines


def _gpu_head(gpu: Mapping[str, Any], state: Mapping[str, Any] | None, size: int) -> str:
    """``GPU 0 leased [####----] 0.50  mem [##------] 10 GiB/80 GiB  util [#---] 12%``."""
    leased = 1.0 - float(gpu["free"])
    text = f"GPU {gpu['index']:<2} leased {bar(leased, size)} {leased:4.2f}"
    if gpu.get("free_mib") is not None:
        text += f" ({format_mib(gpu['free_mib'])} free)"
    if state is not None:
        used, total = state.get("used_mib"), state.get("total_mib")
        if used is not None and total:
            text += f"  mem {bar(used / total, size)} {format_mib(used)}/{format_mib(total)}"
        else:
            text += "  mem unknown"
        util = state.get("utilization")
        text += f"  util {bar(util / 100, size)} {util:3d}%" if util is not None else ""
        if state.get("withheld_mib"):
            text += f"  withheld {format_mib(state['withheld_mib'])}"
    return f"{text}  {printable(gpu['device'])}"


def _lease_line(lease: Mapping[str, Any], gpu: int, fraction: float) -> str:
    """``  #3 alice pid 4405 [train]  0.50 of it, 1.2 h  uses 10 GiB  OVER 8 GiB``."""
    share = _share_on(lease, gpu, fraction)
    line = (
        f"    #{lease['id']} {printable(lease['user'])} pid {lease['pid']}{_label(lease)}  "
        f"{share}, held {_duration(lease['held_s'])}"
    )
    if lease.get("used_mib") is not None:
        line += f", uses {format_mib(lease['used_mib'])}"
    if lease.get("over_lease"):
        allowed = lease.get("allowed_mib")
        line += " OVER its lease" + (f" of {format_mib(allowed)}" if allowed is not None else "")
    return line


def _share_on(lease: Mapping[str, Any], gpu: int, fraction: float) -> str:
    """What ``lease`` holds of ``gpu``: MiB on a server sized in memory, else a fraction."""
    for held_gpu, mib in lease.get("held_mib") or ():
        if int(held_gpu) == gpu:
            return f"{format_mib(int(mib))} ({fraction:.2f})"
    return "whole GPU" if fraction >= 1 - EPSILON else f"{fraction:.2f} of it"


# ----------------------------------------------------------------- the queue
def _queue_lines(report: Report) -> list[str]:
    waiting = report["waiting"]
    lines = [f"queue ({len(waiting)}, in order):" if waiting else "queue: empty"]
    for waiter in waiting:
        lines.append(
            f"  {waiter['position']}. #{waiter['id']} {_owner(waiter)} pid {waiter['pid']}"
            f"{_label(waiter)}: {_asked(waiter)}, waiting {_duration(waiter['waited_s'])}"
            f" -- {why_waiting(waiter, report)}{_reason(waiter)}"
        )
    return lines


def _reason(waiter: Mapping[str, Any]) -> str:
    """`` [priority; starts in about 3 min (14:03:12)]``: the server's reason code and its
    estimate of the start (none from an older server)."""
    words = wait_words(waiter, detail=False)
    return f" [{words}]" if words else ""


def why_waiting(waiter: Mapping[str, Any], report: Report) -> str:
    """Why ``waiter`` is not granted yet, in words, from what the report says: the server
    holding every grant back, its owner's limits, a reservation, no GPU with room, or the
    requests ahead of it."""
    server = report["server"]
    if server.get("journal_error"):
        return "the server cannot write its journal: nothing is granted"
    if server.get("recovering_s"):
        return "the server is recovering after a restart"
    if server.get("draining") is not None:
        return f"the server is draining: {printable(server['draining'])}"
    if waiter.get("held"):
        return f"held by its owner's limits: {printable(waiter['held'])}"
    if waiter.get("reserved"):
        gpus = ",".join(str(g) for g in waiter["reserved"])
        return f"GPU {gpus} reserved for it, until the leases there end"
    room = _gpus_with_room(waiter, report["gpus"])
    if room < waiter["count"]:
        return f"no room: {room} GPU{'' if room == 1 else 's'} with {_asked_one(waiter)} free"
    return "behind the requests ahead of it (fair-share order)"


def _gpus_with_room(waiter: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]]) -> int:
    """How many GPUs have room for one GPU's part of ``waiter``'s request now."""
    if waiter.get("memory_mib") is not None:
        return sum(1 for g in gpus if (g.get("free_mib") or 0) >= waiter["memory_mib"])
    wanted = 1.0 if waiter["count"] > 1 else float(waiter["fraction"] or 1.0)
    return sum(1 for g in gpus if float(g["free"]) + EPSILON >= wanted)


def _asked(waiter: Mapping[str, Any]) -> str:
    if waiter["count"] > 1:
        return f"{waiter['count']} whole GPUs"
    return _asked_one(waiter)


def _asked_one(waiter: Mapping[str, Any]) -> str:
    """What one GPU of the request must have free: MiB, a fraction or all of it."""
    if waiter.get("memory_mib") is not None:
        return format_mib(waiter["memory_mib"])
    fraction = waiter.get("fraction")
    if waiter["count"] > 1 or fraction is None or fraction >= 1 - EPSILON:
        return "a whole GPU"
    return f"{fraction:g} of a GPU"


def _owner(waiter: Mapping[str, Any]) -> str:
    """``alice`` or ``alice (account ml)``, escaped."""
    account = waiter.get("account")
    user = printable(waiter["user"])
    return user if account is None else f"{user} (account {printable(account)})"


# ----------------------------------------------------------------- outside the queue
def _outside_lines(report: Report) -> list[str]:
    """The processes on a GPU that no lease accounts for (where the server watches)."""
    outside = report.get("outside")
    if outside is None:
        return []
    more = int(report.get("outside_left_out") or 0)
    if not outside:
        return ["outside the queue: none"]
    total = len(outside) + more
    lines = [f"outside the queue ({total}{f', {more} not shown' if more else ''}):"]
    for proc in outside:
        used, user = proc.get("used_mib"), proc.get("user") or f"uid {proc.get('uid')}"
        lines.append(
            f"  pid {proc['pid']} {printable(user)} on GPU {proc['gpu']}: "
            f"{'? MiB' if used is None else format_mib(int(used))}"
        )
    return lines


# ----------------------------------------------------------------- pieces
def bar(fraction: float, size: int) -> str:
    """``[###-----]``: ``fraction`` (clamped to 0..1) of ``size`` cells filled."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * size)
    return "[" + "#" * filled + "-" * (size - filled) + "]"


def _by_gpu(items: object, key: str) -> dict[int, Mapping[str, Any]]:
    """The optional per-GPU records of the report by GPU index ({} where there are none)."""
    if not isinstance(items, Sequence):
        return {}
    return {int(item[key]): item for item in items if isinstance(item, Mapping)}


def _label(item: Mapping[str, Any]) -> str:
    name = item.get("name")
    return f" [{printable(name)}]" if name else ""


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + ">"
