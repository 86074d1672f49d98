"""``hwpool run -- CMD``: wait in the host-wide queue for a share of the GPUs, then run CMD on it.

Exit status: the command's (killed by signal N: 128 + N); 2 for bad usage; 124 when
``--timeout`` passed in the queue, or when the job ran past ``--time`` and was ended; 125
when no server answers or the request fails; 126 / 127 when CMD cannot be run / is not
found; 130 / 143 / 129 for SIGINT / SIGTERM / SIGHUP while waiting (the request is withdrawn
first).

A server that goes away while the job runs does not end it: ``hwpool run`` waits for it to
come back (``--reconnect-timeout``, ``HWPOOL_RECONNECT_TIMEOUT``; default: for as long as it
takes) and re-declares the lease there; only a server that says the lease is gone (revoked,
or lost in a restart) ends the job. A signal ignored when ``hwpool run`` starts (``nohup``
ignores SIGHUP, a shell's ``&`` SIGINT) stays ignored, by it and by the job; and a closed
stderr (``2>&-``) is no terminal: nothing is written there.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from .._backends._unix import UnixBackend
from .._check import check_int, duration_from_text
from .._core._memory import format_mib, parse_memory
from .._errors import PoolClosedError, RevokedError
from .._gpu._lease import GPULease
from .._gpu._pool import GPUPool
from .._wire._paths import client_socket
from .._wire._protocol import MAX_PRIORITY, MAX_TEXT
from . import _autostart, _child
from ._child import say
from ._text import one_line, plural
from ._waitline import WaitLine

__all__ = [
    "demand_from_text",
    "limit_from_text",
    "memory_from_text",
    "priority_from_text",
    "register",
]

GRACE_S = 5.0
CONNECT_TIMEOUT_S = 10.0  # how long connecting to the server (and its hello) may take
MIN_CONNECT_S = 0.5  # ... at least, even with a shorter --timeout (0: only if free now)


class _Exit(Exception):
    """End ``hwpool run`` with ``status``, after one line on stderr."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Signalled(BaseException):
    """SIGTERM or SIGHUP while waiting in the queue (SIGINT is KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def register(commands: Any) -> None:
    """Add ``run`` to the ``hwpool`` subcommands."""
    run = commands.add_parser(
        "run", help="wait for a share of the GPUs, then run a command on it",
        usage="hwpool run [-h] [--gpus G | --mem SIZE] [--timeout S] [--time LIMIT] "
        "[--name NAME] [--priority P] [--no-start] [--socket PATH] [--grace S] "
        "[--reconnect-timeout S] -- CMD [ARGS...]",
        description="Wait in the host-wide queue for G of the GPUs (or SIZE of one GPU's "
        "memory), then run CMD with CUDA_VISIBLE_DEVICES set to them; exit with its status.",
    )  # fmt: skip
    run.add_argument(
        "--socket", metavar="PATH",
        help="the server's socket (default: $HWPOOL_SOCKET, else the machine-wide one "
        "($HWPOOL_SYSTEM_SOCKET, else /run/hwpool/hwpool.sock) if it is there, else the "
        "per-user one, where a server is started if none runs)",
    )  # fmt: skip
    run.add_argument(
        "--gpus", type=demand_from_text, metavar="G",
        help="a fraction in (0, 1] of one GPU, or an integer >= 2 of whole GPUs (default 1)",
    )  # fmt: skip
    run.add_argument(
        "--mem", type=memory_from_text, metavar="SIZE",
        help="SIZE of one GPU's memory instead (6GiB, 512MiB, 20G), on a server sized in memory "
        "(`hwpool serve --memory`; a server this starts is)",
    )  # fmt: skip
    run.add_argument("--timeout", type=_seconds, metavar="S", help="give up waiting after S s")
    run.add_argument(
        "--time", type=limit_from_text, metavar="LIMIT",
        help="a time limit for the job once it runs (90s, 30m, 2h, 1d, or seconds): past it "
        "the job's process group gets SIGTERM, SIGKILL --grace S later, and hwpool run exits "
        "124; the server counts on the limit (plus the grace), and may let the job start "
        "ahead of a wide request that waits",
    )  # fmt: skip
    run.add_argument("--name", metavar="NAME", help="a name for the job in `hwpool status`")
    run.add_argument(
        "--priority", type=priority_from_text, default=0, metavar="P",
        help=f"an int in -{MAX_PRIORITY}..{MAX_PRIORITY} (default 0): higher goes first among "
        "your own waiting jobs; it never passes another user's",
    )  # fmt: skip
    run.add_argument(
        "--no-start", action="store_true",
        help="do not start a server when none runs (also: HWPOOL_AUTOSTART=0)",
    )  # fmt: skip
    run.add_argument(
        "--grace", type=_seconds, default=GRACE_S, metavar="S",
        help="after CMD exits, what is left of its process group gets SIGTERM, and SIGKILL "
        f"S s later (default {GRACE_S:g})",
    )  # fmt: skip
    run.add_argument(
        "--reconnect-timeout", type=_seconds, metavar="S",
        help="if the server goes away, wait S s for it to come back before giving the lease "
        "up and ending the job (default: $HWPOOL_RECONNECT_TIMEOUT, else until it is back)",
    )  # fmt: skip
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    run.set_defaults(run=_cmd_run)


def demand_from_text(text: str) -> Fraction | int:
    """``--gpus``: a fraction in (0, 1] (``0.25``, ``1/4``) or an integer >= 2 of whole GPUs."""
    try:
        value = Fraction(text.strip()) if len(text) <= 40 else None
    except (ValueError, ZeroDivisionError):
        value = None
    if value is not None and value.denominator == 1 and value >= 2:
        return int(value)
    if value is None or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"must be a fraction in (0, 1] of one GPU or an integer >= 2 of whole GPUs, "
            f"got {text[:40]!r}"
        )
    return value


def priority_from_text(text: str) -> int:
    """``--priority``: an int within the protocol's bounds (argparse names the option)."""
    try:
        return check_int("priority", int(text, 10), minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer in -{MAX_PRIORITY}..{MAX_PRIORITY}"
        ) from exc


def memory_from_text(text: str) -> int:
    """``--mem``: an amount of memory (see ``hwpool._core._memory``), in MiB."""
    try:
        return parse_memory(text, "SIZE")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def limit_from_text(text: str) -> float:
    """``--time``: a duration (``90s``, ``30m``, ``2h``, or seconds), > 0."""
    try:
        return duration_from_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    try:
        return _autostart.seconds_from_text(text, "S")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds >= 0, got {text[:40]!r}"
        ) from None


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except _Exit as exc:
        say(f"hwpool: error: run: {one_line(str(exc))}")
        return exc.status


def _run(args: argparse.Namespace) -> int:
    if args.gpus is not None and args.mem is not None:
        raise _Exit(2, f"give --gpus or --mem, not both (--gpus {args.gpus}, --mem {args.mem} MiB)")
    argv = _command(args.command)
    if args.name is not None:
        args.name = _carried(args.name)
    if args.name is not None and len(args.name) > MAX_TEXT:
        raise _Exit(2, f"--name: at most {MAX_TEXT} characters, got {len(args.name)}")
    try:
        chosen = client_socket(args.socket)
    except ValueError as exc:
        raise _Exit(2, str(exc).replace("socket:", "--socket:", 1)) from None
    path = chosen.path
    autostart = not args.no_start and _autostart.autostart_from_env(os.environ) and chosen.per_user
    label = _carried(shlex.join(argv))
    if len(label) > MAX_TEXT:
        label = label[: MAX_TEXT - 3] + "..."
    reconnect = args.reconnect_timeout
    if reconnect is None:
        try:
            reconnect = _autostart.reconnect_timeout_from_env(os.environ)
        except ValueError as exc:
            raise _Exit(2, str(exc)) from None
    started = time.monotonic()
    try:
        with _stopping():
            backend = _autostart.connect(
                path, autostart=autostart, name=args.name, command=label,
                memory=args.mem is not None, reconnect_timeout=reconnect,
                connect_timeout=_connect_timeout(args.timeout),
            )  # fmt: skip
    except ConnectionError as exc:
        if args.timeout is not None and time.monotonic() - started >= args.timeout:
            raise _Exit(124, f"no answer within --timeout {args.timeout:g} s: {exc}") from None
        raise _Exit(125, str(exc)) from None
    except _Signalled as exc:
        return 128 + exc.signum
    try:
        return _lease_and_run(GPUPool(backend=backend), args, argv, path)
    finally:
        backend.close()  # the server has freed everything of this process when it returns


def _connect_timeout(timeout: float | None) -> float:
    """How long connecting may take: as always, but no longer than ``--timeout`` (a server
    that accepts and never answers, stopped or hung, must not outlast it)."""
    if timeout is None:
        return CONNECT_TIMEOUT_S
    return min(CONNECT_TIMEOUT_S, max(timeout, MIN_CONNECT_S))


def _command(words: list[str]) -> list[str]:
    """The command after ``--``; exit 127 / 126 before queueing if it cannot be run."""
    argv = words[1:] if words[:1] == ["--"] else words
    if not argv:
        raise _Exit(2, "give the command to run: hwpool run [OPTIONS] -- CMD [ARGS...]")
    program = argv[0]
    found = shutil.which(program) if os.sep not in program else program
    if found is None or not os.path.exists(found):
        raise _Exit(127, f"{program}: command not found")
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise _Exit(126, f"{program}: not an executable file")
    return argv


def _lease_and_run(pool: GPUPool, args: argparse.Namespace, argv: list[str], path: Path) -> int:
    lease, what = _lease(pool, args, path)
    started = time.monotonic()
    _wait(lease, what, path, started, args.timeout)
    granted = time.monotonic()
    limit = args.time
    try:
        say(
            f"hwpool run: {_granted(lease)} after {granted - started:.1f} s; "
            f"running {shlex.join(argv)}"
            + ("" if limit is None else f" for at most {_duration_text(limit)} (--time)")
        )
        return _child.run_job(
            argv, lease.env(), args.grace, _holds(pool, lease), _LOST,
            deadline=None if limit is None else granted + limit,
            late=_late(limit, args.grace) if limit is not None else "",
        )  # fmt: skip
    finally:
        lease.__exit__(None, None, None)


def _late(limit: float, grace: float) -> str:
    """The line ``hwpool run`` says when the job runs past ``--time``."""
    return (
        f"hwpool run: timed out: the job ran past --time {_duration_text(limit)}; ending it "
        f"(SIGTERM, then SIGKILL after {grace:g} s); exit status 124"
    )


def _duration_text(seconds: float) -> str:
    """``90 s``, ``30 min``, ``2 h``: a --time as people read it."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _limit_s(args: argparse.Namespace) -> float | None:
    """The ``limit_s`` sent with the request: ``--time`` plus ``--grace``, which is when the
    job is surely gone (SIGKILL comes ``--grace`` s after SIGTERM), so that the server (and
    the policy that counts on the limit) never sees the GPU free while the job still runs."""
    return None if args.time is None else args.time + args.grace


def _lease(pool: GPUPool, args: argparse.Namespace, path: Path) -> tuple[GPULease, str]:
    """The lease ``--gpus`` or ``--mem`` asks for, and what it is in words."""
    timeout, priority, limit = args.timeout, args.priority, _limit_s(args)
    if args.mem is not None:
        try:
            lease = pool.lease(memory=args.mem, timeout=timeout, priority=priority, limit_s=limit)
            return lease, format_mib(args.mem)
        except ValueError as exc:  # a server that shares fractions, or too much for every GPU
            raise _Exit(
                2, f"--mem {format_mib(args.mem)}: {exc} (server on {str(path)!r})"
            ) from None
    demand: Any = Fraction(1) if args.gpus is None else args.gpus  # exact: a Fraction or int
    if isinstance(demand, int) and demand > pool.num_gpus:
        raise _Exit(
            2, f"--gpus {demand}: the server on {str(path)!r} has {plural(pool.num_gpus, 'GPU')}"
        )
    if isinstance(demand, int):
        lease = pool.lease_full(demand, timeout=timeout, priority=priority, limit_s=limit)
        return lease, plural(demand, "whole GPU")
    return pool.lease(demand, timeout=timeout, priority=priority, limit_s=limit), _share(demand)


def _carried(text: str) -> str:
    """``text`` from the command line as the server can be sent it: an argument's bytes that
    are not UTF-8 (held as lone surrogates) become ``\\xNN``."""
    if text.isascii():
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_LOST = (
    "hwpool run: the lease is no longer held (revoked by `hwpool cancel`, or lost with the "
    "server): ending the job"
)


def _holds(pool: GPUPool, lease: GPULease) -> Callable[[], bool]:
    """Whether the server still counts ``lease`` as this process's (a revoked lease, or one a
    restarted server did not take back, is not: its GPU may be handed on). One the server
    revoked for its time limit counts as held: ``--time``'s own deadline, which is no later,
    ends the job as timed out (not as lost)."""
    backend, grant = pool._backend, lease._grant
    assert isinstance(backend, UnixBackend) and grant is not None
    ticket = grant.ticket
    return lambda: backend.lease_id(ticket) is not None or backend.revoked_by_limit(ticket)


def _wait(lease: GPULease, what: str, path: Path, started: float, timeout: float | None) -> None:
    """Enter ``lease``: wait in the queue, with a status line on a terminal."""
    backend = lease._pool._backend
    assert isinstance(backend, UnixBackend)
    line = WaitLine(sys.stderr, what, backend.status) if _on_terminal(sys.stderr) else None
    try:
        with _stopping():
            lease.__enter__()
    except TimeoutError:
        _close(line)
        raise _Exit(124, f"no {what} granted within --timeout {timeout:g} s") from None
    except KeyboardInterrupt:
        _close(line)
        raise _Exit(130, f"interrupted after {_waited(started)} in the queue; withdrawn") from None
    except _Signalled as exc:
        _close(line)
        name = signal.Signals(exc.signum).name
        raise _Exit(
            128 + exc.signum, f"{name} after {_waited(started)} in the queue; withdrawn"
        ) from None
    except (ConnectionError, RevokedError, PoolClosedError) as exc:
        _close(line)
        raise _Exit(125, str(exc)) from None
    _close(line)


def _on_terminal(stream: TextIO | None) -> bool:
    """Whether ``stream`` is a terminal: a closed stderr (None, or a descriptor that is gone)
    is not."""
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


def _close(line: WaitLine | None) -> None:
    if line is not None:
        line.close()


def _waited(started: float) -> str:
    return f"{time.monotonic() - started:.1f} s"


def _share(fraction: Fraction) -> str:
    return "1 GPU" if fraction == 1 else f"{float(fraction):g} of a GPU"


def _granted(lease: GPULease) -> str:
    gpus, devices = lease.gpus, ",".join(lease.devices)
    mib = lease.memory_mib
    if mib is not None and lease.fraction < 1:
        return f"{format_mib(mib)} of GPU {gpus[0]} (device {devices}) granted"
    if lease.fraction < 1:
        return f"{lease.fraction:g} of GPU {gpus[0]} (device {devices}) granted"
    if len(gpus) == 1:
        return f"GPU {gpus[0]} (device {devices}) granted"
    return f"GPUs {','.join(map(str, gpus))} (devices {devices}) granted"


@contextlib.contextmanager
def _stopping() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise :class:`_Signalled` (SIGINT stays Ctrl-C);
    one that is ignored (``nohup``) stays ignored."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Signalled(signum)

    previous = {
        signum: signal.signal(signum, stop)
        for signum in (signal.SIGTERM, signal.SIGHUP)
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
