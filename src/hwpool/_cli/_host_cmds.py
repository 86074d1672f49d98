"""``hwpool serve``, ``hwpool status`` and ``hwpool cancel``: the host-wide GPU queue.

Each command reports its own errors in one line (``hwpool: error: ...``): exit 2 for bad usage
or a request the server refuses (an unknown id, someone else's lease), 1 when no server can be
reached, 0 otherwise. Whatever another user wrote (a job's name, a command line, a user name)
is shown through :func:`printable`, so it can neither drive the terminal nor forge a line.
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._check import int_from_text
from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._limits import OwnerLimits
from .._core._memory import format_mib
from .._core._scheduler import POLICIES
from .._gpu._env import device_id
from .._gpu._sizing import capacities_of, sized_gpus
from .._host._detect import GPUInfo, detect_gpus, gpu_memory_in_use
from .._jobs._model import JOB_ID_PREFIX
from .._server import _listen
from .._server._config import DEFAULT_CONFIG, ConfigError, read_config
from .._server._host_state import MAX_REQUESTS_PER_CONNECTION, MAX_REQUESTS_PER_USER
from .._server._server import ServeConfig, serve
from .._wire._connection import Wire
from .._wire._paths import client_socket, socket_path, system_socket
from .._wire._protocol import (
    Cancel,
    Done,
    ErrorReply,
    LeaseRecord,
    StatusReply,
    WaiterRecord,
    encode,
)
from ._args import gpu_memory_list
from ._jobs_cmds import CancelRefused, cancel_jobs, job_id_argument
from ._text import one_line, printable

__all__ = ["register"]


class _Usage(Exception):
    """Bad usage: one line on stderr, exit status 2."""


def register(commands: Any) -> None:
    """Add ``serve``, ``status`` and ``cancel`` to the ``hwpool`` subcommands."""
    srv = commands.add_parser("serve", help="share this host's GPUs among all its processes")
    _socket_option(srv)
    srv.add_argument("--gpus", type=_count, metavar="N", help="N logical GPUs (default: detect)")
    srv.add_argument(
        "--memory", action="store_true",
        help="share each detected GPU by its memory, so requests may ask for MiB "
        "(`hwpool run --mem 6GiB`); a fraction is then that share of the GPU it lands on",
    )  # fmt: skip
    srv.add_argument(
        "--gpu-memory", type=gpu_memory_list, metavar="SIZE[,SIZE...]",
        help="logical GPUs of these memory sizes, e.g. 80GiB,24GiB (as --memory, without "
        "detection)",
    )  # fmt: skip
    srv.add_argument(
        "--reserve-in-use", action="store_true",
        help="with --memory: leave alone the memory other processes use on each GPU when the "
        "server starts (each GPU's share is its total less that)",
    )  # fmt: skip
    srv.add_argument(
        "--group", metavar="NAME",
        help="also serve the members of group NAME (directory 0770, socket 0660)",
    )  # fmt: skip
    srv.add_argument(
        "--grace", type=_seconds, metavar="S",
        help="after a restart, grant nothing new for up to S s while clients reclaim (default 5)",
    )  # fmt: skip
    srv.add_argument(
        "--max-connections", type=_count, metavar="N",
        help="connections allowed per uid (default 64); `hwpool status` and `hwpool cancel` "
        "connect beyond them, on up to --max-control-connections more",
    )  # fmt: skip
    srv.add_argument(
        "--max-control-connections", type=_count, metavar="N",
        help="connections per uid for status and cancel only, beyond --max-connections "
        "(default 8)",
    )  # fmt: skip
    srv.add_argument(
        "--max-requests-per-connection", type=_count, metavar="N",
        help="leases and waiters one connection may have at once (default "
        f"{MAX_REQUESTS_PER_CONNECTION}); past it an acquire gets an error",
    )  # fmt: skip
    srv.add_argument(
        "--max-requests-per-user", type=_count, metavar="N",
        help="leases and waiters one uid may have at once, over all its connections "
        f"(default {MAX_REQUESTS_PER_USER})",
    )  # fmt: skip
    srv.add_argument(
        "--hello-timeout", type=_seconds, metavar="S",
        help="close a connection that sends no hello, or half a message, for S s (default 10)",
    )  # fmt: skip
    srv.add_argument(
        "--idle-timeout", type=_seconds, metavar="S",
        help="stop after S s with no client connected (default: never; `hwpool run` starts "
        "its servers with 600)",
    )  # fmt: skip
    srv.add_argument(
        "--policy", choices=POLICIES,
        help="the scheduling policy (default easy; reserve-all: the one hwpool started from)",
    )  # fmt: skip
    srv.add_argument(
        "--config", type=Path, metavar="PATH",
        help=f"read settings from this TOML file (default: {DEFAULT_CONFIG} if it exists and "
        "the server listens on the machine-wide socket); flags override it",
    )  # fmt: skip
    srv.add_argument(
        "--check-config", action="store_true",
        help="check the config file and print the settings the server would run with; exit "
        "0 if they are good, 2 if not (nothing is started)",
    )  # fmt: skip
    srv.set_defaults(run=_guarded(_cmd_serve))

    status = commands.add_parser("status", help="the host-wide queue: GPUs, leases, waiters")
    _socket_option(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of text")
    status.set_defaults(run=_guarded(_cmd_status))

    cancel = commands.add_parser(
        "cancel",
        help="cancel jobs (j12), withdraw waiters or revoke leases (12): by id, by name, or "
        "all of yours",
        description="Cancel each ID: a job id such as j12 (`hwpool jobs`: a queued job is "
        "withdrawn, a running one ended, SIGTERM then SIGKILL after a grace) or a host "
        "server's request id such as 12 (`hwpool status` shows #12: the waiter is withdrawn, "
        "the lease revoked). --name and --mine select server requests.",
    )  # fmt: skip
    cancel.add_argument(
        "ids", type=_cancel_id, nargs="*", metavar="ID",
        help="a job id (j12, as `hwpool jobs` shows) or a server request id (12, as "
        "`hwpool status` shows #12)",
    )  # fmt: skip
    cancel.add_argument(
        "--name", metavar="NAME",
        help="also every request named NAME that you may cancel (yours; an admin's: anyone's)",
    )  # fmt: skip
    cancel.add_argument(
        "--mine", action="store_true",
        help="also every request of yours (with --name: those of yours named NAME)",
    )  # fmt: skip
    _socket_option(cancel)
    cancel.set_defaults(run=_guarded(_cmd_cancel))


def _socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket", metavar="PATH",
        help="the server's socket (default: $HWPOOL_SOCKET, else "
        "$XDG_RUNTIME_DIR/hwpool/hwpool.sock, else /tmp/hwpool-UID/hwpool.sock; status and "
        "cancel look for the machine-wide server first: $HWPOOL_SYSTEM_SOCKET, else "
        "/run/hwpool/hwpool.sock)",
    )  # fmt: skip


def _count(text: str) -> int:
    try:
        return int_from_text("the value", text, minimum=1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("the value ")) from None


def _cancel_id(text: str) -> int | str:
    """``j12`` (a job id, kept as text) or ``12`` (a server request id, as an int)."""
    if text.startswith(JOB_ID_PREFIX):
        return job_id_argument(text)
    if not text.isascii() or not text.isdigit():
        raise argparse.ArgumentTypeError(
            f"must be a job id such as 'j12' (`hwpool jobs`) or a server request id such as 12 "
            f"(`hwpool status` shows #12), got {text!r}"
        )
    return _count(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _guarded(command: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            status: int = command(args)
        except _Usage as exc:
            print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # our reader went away (`| head`): main() ends quietly
            raise
        except ConnectionError as exc:
            print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
            return 1
        return status

    return run


def _path(args: argparse.Namespace, client: bool = True) -> Path:
    """The socket to use: a client's (the machine-wide server first) or, for ``serve``,
    the one to serve on; bad usage for a path that cannot be one."""
    try:
        return client_socket(args.socket).path if client else socket_path(args.socket)
    except ValueError as exc:
        raise _Usage(str(exc).replace("socket:", "--socket:", 1)) from None


# ----------------------------------------------------------------- serve
_BUILT_IN: dict[str, object] = {
    "gpus": None, "memory": False, "gpu_memory": None, "reserve_in_use": False, "group": None,
    "grace": 5.0, "policy": POLICIES[0], "max_connections": 64, "max_control_connections": 8,
    "max_requests_per_connection": MAX_REQUESTS_PER_CONNECTION,
    "max_requests_per_user": MAX_REQUESTS_PER_USER, "hello_timeout": 10.0,
    "idle_timeout": None, "half_life": DEFAULT_HALF_LIFE, "shares": {}, "limits": {},
    "default_limits": None, "accounts": {},
}  # fmt: skip
"""Each setting's value when neither a flag nor the config file gives it."""


def _config_file(args: argparse.Namespace, socket: Path) -> Path | None:
    """The config file to read: ``--config``, else the default one for the machine-wide
    server (on the machine-wide socket) if it exists, else none."""
    if args.config is not None:
        return Path(args.config)
    try:
        machine_wide = system_socket()
    except ValueError:
        machine_wide = None
    if machine_wide is not None and socket == machine_wide and DEFAULT_CONFIG.exists():
        return DEFAULT_CONFIG
    return None


def _settings(args: argparse.Namespace, socket: Path) -> tuple[Path | None, dict[str, Any]]:
    """The config file read (if any) and the effective settings: a flag given on the command
    line, else the file's value, else the built-in default. Bad usage for a bad file."""
    path = _config_file(args, socket)
    try:
        from_file = {} if path is None else read_config(path, {0, os.geteuid()})
    except ConfigError as exc:
        raise _Usage(str(exc)) from None
    settings: dict[str, Any] = {**_BUILT_IN, **from_file}
    for key in _BUILT_IN:
        given = getattr(args, key, None)
        if key == "group" and given is not None:
            settings[key] = _group(given)
        elif given is not None and given is not False:  # a flag given overrides the file
            settings[key] = given
    return path, settings


def _check_config(path: Path | None, settings: dict[str, Any]) -> int:
    """``--check-config``: the file and the effective settings, one per line (TOML)."""
    print(f"# config file: {path if path is not None else 'none'}")
    for key, value in settings.items():
        if key in ("shares", "limits", "default_limits", "accounts"):
            continue
        if value is None:
            print(f"# {key}: not set")
        else:
            print(f"{key} = {json.dumps(list(value) if isinstance(value, tuple) else value)}")
    _print_accounts(settings["accounts"])
    print("[shares]  # uid or account: share (everyone else: 1)")
    for owner, share in sorted(settings["shares"].items(), key=_owner_order):
        print(f"{_owner_key(owner)} = {share:g}{_owner_comment(owner)}")
    if settings["default_limits"] is None:
        print("# limits.default: not set (users not named have no limits)")
    else:
        print("[limits.default]")
        _print_limits(settings["default_limits"])
    for owner, limits in sorted(settings["limits"].items(), key=_owner_order):
        table = "accounts" if isinstance(owner, str) else "users"
        print(f"[limits.{table}.{_owner_key(owner)}]{_owner_comment(owner)}")
        _print_limits(limits)
    return 0


def _print_accounts(accounts: dict[str, frozenset[int]]) -> None:
    """``[accounts]`` as resolved: each account's members by uid, their names beside."""
    if not accounts:
        print("# accounts: none (each user is its own owner)")
        return
    print("[accounts]  # each account's members, as resolved now: scheduled as one owner")
    for name, uids in sorted(accounts.items()):
        members = ", ".join(f'"uid:{uid}"' for uid in sorted(uids))
        names = ", ".join(printable(_user(uid)) for uid in sorted(uids))
        print(f"{name} = [{members}]" + (f"  # {names}" if names else ""))


def _owner_order(item: tuple[int | str, object]) -> tuple[int, int, str]:
    """uids by number first, then accounts by name."""
    owner = item[0]
    return (1, 0, owner) if isinstance(owner, str) else (0, owner, "")


def _owner_key(owner: int | str) -> str:
    """An owner as a TOML key: ``"uid:1000"`` or an account's name (bare: it needs no quotes)."""
    return owner if isinstance(owner, str) else f'"uid:{owner}"'


def _owner_comment(owner: int | str) -> str:
    """``  # alice`` beside a uid; nothing beside an account (its name says it)."""
    return "" if isinstance(owner, str) else f"  # {printable(_user(owner))}"


def _print_limits(limits: OwnerLimits) -> None:
    """One table of limits as TOML lines (those not set as comments)."""
    for key, field in (("gpus", "gpus"), ("memory", "units"), ("running", "running"),
                       ("queued", "queued")):  # fmt: skip
        value = getattr(limits, field)
        print(f"# {key}: not set" if value is None else f"{key} = {value:g}")
    print(f'mode = "{limits.mode}"')


def _memory_limits_need_memory(settings: dict[str, Any]) -> None:
    """Bad usage for a ``memory`` limit on a server that shares fractions, not memory."""
    if settings["memory"] or settings["gpu_memory"] is not None:
        return
    tables = [settings["default_limits"], *settings["limits"].values()]
    if any(limits is not None and limits.units is not None for limits in tables):
        raise _Usage(
            "[limits]: a memory limit needs a server sized in memory (--memory or "
            "--gpu-memory, or memory or gpu_memory in the config file)"
        )


def _cmd_serve(args: argparse.Namespace) -> int:
    path = _path(args, client=False)
    config_path, settings = _settings(args, path)
    args = argparse.Namespace(**{**vars(args), **settings})
    _memory_limits_need_memory(settings)
    if args.check_config:
        return _check_config(config_path, settings)
    if args.gpu_memory is None and not args.memory and not args.reserve_in_use:
        gpus, totals = _gpus(args.gpus), None
    else:
        gpus = _sized(args)
        totals = capacities_of(gpus, args.reserve_in_use)
    config = ServeConfig(
        socket=path, gpus=gpus, group=args.group, grace_s=args.grace,
        hello_timeout_s=args.hello_timeout, max_connections=args.max_connections,
        max_control_connections=args.max_control_connections,
        max_requests_per_connection=args.max_requests_per_connection,
        max_requests_per_user=args.max_requests_per_user,
        idle_timeout_s=args.idle_timeout, policy=args.policy, totals=totals,
        shares=args.shares, half_life=args.half_life, limits=args.limits,
        default_limits=args.default_limits, accounts=args.accounts,
    )  # fmt: skip
    try:
        serve(config)
    except _listen.ServeError as exc:
        raise _Usage(str(exc)) from None
    return 0


def _gpus(count: int | None) -> tuple[GPUInfo, ...]:
    if count is not None:
        return tuple(GPUInfo(i, str(i)) for i in range(count))
    try:
        found = detect_gpus()
    except ValueError as exc:  # a malformed HWPOOL_NUM_GPUS
        raise _Usage(str(exc)) from None
    return found.gpus if found.count else (GPUInfo(0, "0"),)


def _sized(args: argparse.Namespace) -> tuple[GPUInfo, ...]:
    """The GPUs of a server sized in memory: ``--gpu-memory``'s, or detected (``--memory``)."""
    if args.reserve_in_use and not args.memory:
        raise _Usage("--reserve-in-use reads the memory in use on detected GPUs: give --memory")
    if args.gpus is not None:
        flag = "--memory" if args.memory else "--gpu-memory"
        raise _Usage(f"give --gpus or {flag}, not both (--gpus {args.gpus})")
    if args.memory and args.gpu_memory is not None:
        raise _Usage("give --memory (detect the sizes) or --gpu-memory SIZES, not both")
    try:
        sized = sized_gpus(None, args.memory, args.gpu_memory, args.reserve_in_use)
    except ValueError as exc:  # detection found no memory size (or use) for some GPU
        raise _Usage(f"--memory: {exc}") from None
    assert sized is not None
    return sized


def _group(name: str | None) -> int | None:
    if name is None:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise _Usage(f"--group: no group named {name!r}") from None


# ----------------------------------------------------------------- status and cancel
Record = LeaseRecord | WaiterRecord


def _cmd_status(args: argparse.Namespace) -> int:
    wire = Wire(_path(args), role="control")  # it works even at the cap on connections
    try:
        reply = wire.status()
    finally:
        wire.shutdown()
    report = _report(wire, reply)
    print(json.dumps(report, indent=2) if args.json else _format(report))
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel each id named, and each request ``--name``/``--mine`` select; one line per id
    on what happened. Exit 2 if any was refused (unknown, or not the caller's)."""
    if not args.ids and args.name is None and not args.mine:
        raise _Usage("cancel: give the ids to cancel, --name NAME or --mine (an id: j12 is "
                     "a job's, 12 a server request's)")  # fmt: skip
    ids = list(dict.fromkeys(i for i in args.ids if isinstance(i, int)))
    jobs = list(dict.fromkeys(i for i in args.ids if isinstance(i, str)))
    unfinished = 0
    if jobs:
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
    wire = Wire(_path(args), role="control")  # it works even at the cap on connections
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
            line, ok = _cancel_one(wire, req, ident, known.get(ident))
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


def _cancel_one(wire: Wire, req: int, ident: int, record: Record | None) -> tuple[str, bool]:
    """Cancel ``ident``: the line that says what happened, and whether it was done."""
    wire.send_bytes(encode(Cancel(req, ident)))
    reply = wire.read()
    if isinstance(reply, ErrorReply):
        return one_line(reply.message), False  # the server's message names the id
    if not isinstance(reply, Done):
        raise ConnectionError(f"unexpected reply to cancel: {reply.op}")
    whose = "" if record is None else f" of {_whose(record)}"
    if reply.cancelled == "lease":  # what it was when cancelled (a waiter may have been granted)
        return f"#{ident}: revoked the lease{whose}: its GPUs are free", True
    if reply.cancelled == "waiter":
        return f"#{ident}: withdrew the waiting request{whose}", True
    return f"#{ident}: cancelled{whose}", True  # a server that does not say which


def _whose(record: Record) -> str:
    """``alice pid 4405 [train]``: the owner and name of a request, escaped."""
    name = "" if record.name is None else f" [{printable(record.name)}]"
    return f"{printable(_user(record.uid))} pid {record.pid}{name}"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _report(wire: Wire, reply: StatusReply) -> dict[str, Any]:
    """The status as plain data, fractions of a GPU instead of units (for --json and text);
    on a server sized in memory, MiB beside them."""
    welcome, full, totals = wire.welcome, wire.welcome.units_per_gpu, wire.welcome.totals

    def share(gpu: int, units: int) -> float:
        return units / (full if totals is None else totals[gpu])

    in_use = _in_use_now(welcome.gpus) if totals is not None else (None,) * len(welcome.gpus)

    report = {
        "socket": str(wire.path),
        "server": {
            "pid": welcome.pid, "uid": welcome.uid, "user": _user(welcome.uid),
            "version": welcome.server, "uptime_s": reply.uptime_s,
            "recovering_s": reply.recovering_s, "journal_error": reply.journal_error,
        },
        "sized_in_memory": totals is not None,
        "gpus": [
            {"index": g.index, "device": device_id(g), "device_id": g.device_id, "uuid": g.uuid,
             "name": g.name,
             "parent": g.parent, "memory_mib": g.memory_mib, "free": share(g.index, free),
             "free_mib": None if totals is None else free,
             "total_mib": None if totals is None else totals[g.index],
             "in_use_mib": in_use[g.index]}
            for g, free in zip(welcome.gpus, reply.free, strict=False)
        ],
        "leases": [
            {"id": x.id, "uid": x.uid, "user": _user(x.uid), "pid": x.pid,
             "held": [[gpu, share(gpu, units)] for gpu, units in x.held],
             "held_mib": None if totals is None else [list(p) for p in x.held],
             "held_s": x.age_s, "name": x.name, "command": x.command}
            for x in reply.leases
        ],
        "waiting": [
            {"position": n, "id": w.id, "uid": w.uid, "user": _user(w.uid), "pid": w.pid,
             "count": w.count, "fraction": None if w.unit == "mib" else w.units / full,
             "memory_mib": w.units if w.unit == "mib" else None, "reserved": list(w.reserved),
             "waited_s": w.age_s, "name": w.name, "command": w.command, "held": w.held,
             "account": w.account}
            for n, w in enumerate(reply.waiting, 1)
        ],
        "owners": _owners(reply),
        "owners_left_out": reply.owners_left_out,
        "counters": {
            "granted": reply.granted, "released": reply.released,
            "cancelled": reply.cancelled, "timed_out": reply.timed_out,
        },
    }  # fmt: skip
    return report


def _owners(reply: StatusReply) -> list[dict[str, Any]]:
    """The owners, uids and accounts together, the busiest first (as the server orders each
    list: most running, then most queued; uids before accounts on a tie)."""
    owners: list[dict[str, Any]] = [
        {"uid": o.uid, "user": _user(o.uid), "account": None, "share": o.share,
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
    sized = report["sized_in_memory"]
    lines.append("GPU  free  memory free          device" if sized else "GPU  free  device")
    lines += [_gpu_line(g) for g in report["gpus"]]
    lines.append(f"leases ({len(report['leases'])}):")
    lines += [
        f"  #{x['id']} {printable(x['user'])} pid {x['pid']}: {_held(x)}, "
        f"held {x['held_s']:.1f} s" + _label(x)
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
            f"{reserve}{held}, waiting {w['waited_s']:.1f} s" + _label(w)
        )
    lines += _owner_lines(report["owners"], report["owners_left_out"])
    c = report["counters"]
    lines.append(
        f"granted {c['granted']}, released {c['released']}, cancelled {c['cancelled']}, "
        f"timed out {c['timed_out']}"
    )
    if report["leases"] or report["waiting"]:
        lines.append(ID_NOTE)
    return "\n".join(lines)


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
