"""``hwpool run -- CMD``: wait in the host-wide queue for a share of the GPUs, then run CMD on it.

Exit status (``hwpool._exits``; the table is in docs/cli.md): the command's (killed by signal
N: 128 + N); 2 for bad usage, or a request the server could never grant; 75 when
``--timeout`` passed in the queue (the job never ran: try again later); 77 when the server
does not serve this user; 124 when the job ran past ``--time`` and was ended; 125 when no
server answers, or it went away; 126 / 127 when CMD cannot be run / is not found; 143 when
the request was cancelled (``hwpool cancel``) while it waited; 130 / 143 / 129 for SIGINT /
SIGTERM / SIGHUP while waiting (the request is withdrawn first).

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

from .. import _exits
from .._backends._unix import UnixBackend
from .._core._memory import format_mib
from .._errors import PoolClosedError, RevokedError
from .._gpu._lease import GPULease
from .._gpu._pool import GPUPool
from .._wire._bounds import MAX_TEXT
from .._wire._connection import NotServedError
from .._wire._paths import client_socket
from . import _autostart, _child, _env
from ._child import say
from ._text import one_line, plural
from ._waitline import WaitLine

__all__ = ["cmd_run"]

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


def cmd_run(args: argparse.Namespace) -> int:
    """``hwpool run``: its exit status (see the module)."""
    try:
        return _run(args)
    except _Exit as exc:
        say(f"hwpool: error: run: {one_line(str(exc))}")
        return exc.status


def _run(args: argparse.Namespace) -> int:
    if args.gpus is not None and args.mem is not None:
        raise _Exit(
            _exits.USAGE,
            f"give --gpus or --mem, not both (--gpus {args.gpus}, --mem {args.mem} MiB)",
        )
    argv = _command(args.command)
    if args.name is not None:
        args.name = _carried(args.name)
    if args.name is not None and len(args.name) > MAX_TEXT:
        raise _Exit(_exits.USAGE, f"--name: at most {MAX_TEXT} characters, got {len(args.name)}")
    try:
        chosen = client_socket(args.socket)
    except ValueError as exc:
        raise _Exit(_exits.USAGE, str(exc).replace("socket:", "--socket:", 1)) from None
    path = chosen.path
    autostart = not args.no_start and _env.autostart_from_env(os.environ) and chosen.per_user
    label = _carried(shlex.join(argv))
    if len(label) > MAX_TEXT:
        label = label[: MAX_TEXT - 3] + "..."
    reconnect = args.reconnect_timeout
    if reconnect is None:
        try:
            reconnect = _env.reconnect_timeout_from_env(os.environ)
        except ValueError as exc:
            raise _Exit(_exits.USAGE, str(exc)) from None
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
            raise _Exit(
                _exits.GAVE_UP, f"no answer within --timeout {args.timeout:g} s: {exc}"
            ) from None
        raise _Exit(_connect_failed(exc), str(exc)) from None
    except _Signalled as exc:
        return 128 + exc.signum
    try:
        return _lease_and_run(GPUPool(backend=backend), args, argv, path)
    finally:
        backend.close()  # the server has freed everything of this process when it returns


def _connect_failed(exc: ConnectionError) -> int:
    """The status for a server that could not be used: 77 when it does not serve this user
    (not a member of its group), else 125 (none answers, none could be started, or it is
    not to be trusted)."""
    return _exits.NOT_MEMBER if isinstance(exc, NotServedError) else _exits.HWPOOL_FAILED


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
        raise _Exit(_exits.USAGE, "give the command to run: hwpool run [OPTIONS] -- CMD [ARGS...]")
    program = argv[0]
    found = shutil.which(program) if os.sep not in program else program
    if found is None or not os.path.exists(found):
        raise _Exit(_exits.NOT_FOUND, f"{program}: command not found")
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise _Exit(_exits.CANNOT_RUN, f"{program}: not an executable file")
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
        end = _child.run_job_to_end(
            argv, lease.env(), args.grace, _holds(pool, lease), lambda: _lost(pool, lease),
            deadline=None if limit is None else granted + limit,
            late=_late(limit, args.grace) if limit is not None else "",
        )  # fmt: skip
        if not end.ended and end.returncode < 0 and _child.ended_for_overuse(lease, sync=True):
            say(_OVERUSE_KILLED)  # the server's SIGTERM ended the job before it was told why
        return end.status
    finally:
        lease.__exit__(None, None, None)


def _late(limit: float, grace: float) -> str:
    """The line ``hwpool run`` says when the job runs past ``--time``."""
    return (
        f"hwpool run: timed out: the job ran past --time {_duration_text(limit)}; ending it "
        f"(SIGTERM, then SIGKILL after {grace:g} s); exit status {_exits.TIMED_OUT}"
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
                _exits.USAGE, f"--mem {format_mib(args.mem)}: {exc} (server on {str(path)!r})"
            ) from None
    demand: Any = Fraction(1) if args.gpus is None else args.gpus  # exact: a Fraction or int
    if isinstance(demand, int) and demand > pool.num_gpus:
        raise _Exit(
            _exits.USAGE,
            f"--gpus {demand}: the server on {str(path)!r} has {plural(pool.num_gpus, 'GPU')}",
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


_OVERUSE = (
    "hwpool run: the lease was ended for overuse (its processes used more GPU memory than "
    "it was leased, and the server's over-lease policy is term): ending the job"
)


_OVERUSE_KILLED = (
    "hwpool run: the lease was ended for overuse (its processes used more GPU memory than "
    "it was leased, and the server's over-lease policy is term): the server ended the job"
)


def _lost(pool: GPUPool, lease: GPULease) -> str:
    """What ``hwpool run`` says when the lease is no longer held: why, where it knows."""
    return _OVERUSE if _child.ended_for_overuse(lease) else _LOST


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
        raise _Exit(_exits.GAVE_UP, f"no {what} granted within --timeout {timeout:g} s") from None
    except KeyboardInterrupt:
        _close(line)
        raise _Exit(
            _exits.INTERRUPTED, f"interrupted after {_waited(started)} in the queue; withdrawn"
        ) from None
    except _Signalled as exc:
        _close(line)
        name = signal.Signals(exc.signum).name
        raise _Exit(
            128 + exc.signum, f"{name} after {_waited(started)} in the queue; withdrawn"
        ) from None
    except RevokedError as exc:  # `hwpool cancel` of the request: cancelled, as a job is
        _close(line)
        raise _Exit(_exits.CANCELLED, str(exc)) from None
    except (ConnectionError, PoolClosedError) as exc:
        _close(line)
        raise _Exit(_exits.HWPOOL_FAILED, str(exc)) from None
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
