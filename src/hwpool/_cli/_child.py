"""The job of ``hwpool run``: a child in its own process group, and what is left of it after.

- The child starts in a process group of its own, so that signals forwarded to it reach
  everything it started, and so that whatever of the job outlives it can be found and ended
  before the lease is released. On a terminal the group is made the foreground one (as a
  shell does), so that the job can read the terminal and Ctrl-C reaches it directly; when
  Ctrl-Z stops the job, ``hwpool run`` stops too, and ``fg`` continues both.
- On Linux the child is started through a small wrapper (this Python, ``-I -S``) that sets
  ``PR_SET_PDEATHSIG`` (SIGKILL) with ctypes and then ``exec``s the command: if ``hwpool
  run`` dies, even by SIGKILL, the kernel kills the child. (A wrapper rather than
  ``preexec_fn``: this process has threads, and ``preexec_fn`` is unsafe with threads.) The
  death signal reaches the child only: what the child started lives on unless it dies with
  it, and a process that leaves the group (``setsid``, a double fork) escapes the clean-up
  after a normal exit too. The server frees the lease when ``hwpool run``'s connection
  closes.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from .. import _exits
from .._host._procs import ProcFS

if TYPE_CHECKING:
    from .._gpu._lease import GPULease

__all__ = ["FORWARDED", "TIMED_OUT", "JobEnd", "exit_status", "run_job", "run_job_to_end", "say"]

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KILL_WAIT_S = 5.0  # after SIGKILL, how long the group may take to be gone
WATCH_S = 0.25  # how often the lease is looked at while the job runs
SIGNAL_SLICE_S = 0.25  # how often the wait for the job wakes to act on a signal (_wait_for)
TIMED_OUT = _exits.TIMED_OUT  # the status of a job ended by its time limit (timeout(1)'s)

_WRAPPER = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG, SIGKILL
    if sys.stderr:
        print("hwpool: warning: PR_SET_PDEATHSIG failed", file=sys.stderr)
if os.getppid() != int(sys.argv[1]):
    os._exit(137)  # hwpool run died before the death signal was set: do not start the job
if sys.argv[2] == "fg":
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, os.getpgrp())
    except OSError:
        pass
for name in ("SIGPIPE", "SIGXFSZ", "SIGTTOU"):  # Python ignores these; the job must not
    signal.signal(getattr(signal, name), signal.SIG_DFL)
try:
    os.execvp(sys.argv[3], sys.argv[3:])
except OSError as exc:
    if sys.stderr:
        print(f"hwpool: error: cannot run {sys.argv[3]!r}: {exc.strerror}", file=sys.stderr)
    os._exit(127 if isinstance(exc, FileNotFoundError) else 126)  # _exits.NOT_FOUND, CANNOT_RUN
"""


def say(line: str) -> None:
    """Write ``line`` on stderr, if there is one: with stderr closed (``2>&-``) Python has
    none, and a message must never go to stdout (``print(file=None)`` would) instead."""
    stream = sys.stderr
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        print(line, file=stream, flush=True)


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True, slots=True)
class JobEnd:
    """How a job run by :func:`run_job_to_end` ended: its ``returncode`` (as
    ``subprocess.Popen`` has it: ``-N`` for signal N), whether it ran past its deadline
    (``timed_out``) and whether ``held()`` turned false and it was ended for that
    (``ended``)."""

    returncode: int
    timed_out: bool
    ended: bool

    @property
    def status(self) -> int:
        """The exit status ``hwpool run`` gives: :data:`TIMED_OUT` once timed out, else the
        job's status as a shell reports it."""
        return TIMED_OUT if self.timed_out else exit_status(self.returncode)


def ended_for_overuse(lease: GPULease, *, sync: bool = False) -> bool:
    """Whether the server ended ``lease`` for overuse (``over_lease term``). With ``sync``,
    one status round trip first, so that every message the server sent before (its
    ``revoked``, which precedes its SIGTERM to the job) has been read: a job the server's
    SIGTERM ended may have died before its ``revoked`` was read."""
    backend, grant = lease._pool._backend, lease._grant
    check = getattr(backend, "revoked_for_overuse", None)  # a host server's backend only
    if grant is None or check is None:
        return False
    if not check(grant.ticket) and sync:  # a host server's backend has status()
        with contextlib.suppress(Exception):  # no server to ask: nothing more is known
            backend.status()  # type: ignore[attr-defined]
    return bool(check(grant.ticket))


def run_job(
    argv: Sequence[str],
    env: Mapping[str, str],
    grace_s: float,
    held: Callable[[], bool] | None = None,
    lost: str = "",
    *,
    deadline: float | None = None,
    late: str = "",
) -> int:
    """Run ``argv`` with ``env`` in its own process group; return its exit status once the
    rest of its group is gone too (SIGTERM, then SIGKILL after ``grace_s``).

    SIGINT, SIGTERM and SIGHUP that this process receives meanwhile go to the child's group
    (one ignored when this process started stays ignored, here and in the child).
    ``held()`` is asked a few times a second: once false, ``lost`` is printed on stderr and
    the group is ended the same way (SIGTERM, SIGKILL after ``grace_s``). At ``deadline``
    (``time.monotonic()``), if the job still runs, ``late`` is printed and the group is
    ended so too; the status is then :data:`TIMED_OUT` (124), whatever the job's own.
    """
    end = run_job_to_end(argv, env, grace_s, held, lambda: lost, deadline=deadline, late=late)
    return end.status


def run_job_to_end(
    argv: Sequence[str],
    env: Mapping[str, str],
    grace_s: float,
    held: Callable[[], bool] | None = None,
    lost: Callable[[], str] = str,
    *,
    deadline: float | None = None,
    late: str = "",
    cwd: str | None = None,
    stdio: tuple[int, int, int] | None = None,
) -> JobEnd:
    """:func:`run_job`, saying how the job ended; ``lost()`` is the line printed when
    ``held()`` turns false. ``cwd``: the job's working directory; ``stdio``: descriptors
    for its stdin, stdout and stderr (default: this process's)."""
    tty = _foreground_tty() if stdio is None else None
    command = list(argv)
    if sys.platform == "linux":
        mode = "fg" if tty is not None else "bg"
        command = [sys.executable, "-I", "-S", "-c", _WRAPPER, str(os.getpid()), mode, *argv]
    stdin, stdout, stderr = (None, None, None) if stdio is None else stdio
    with _forwarding() as group:
        child = subprocess.Popen(
            command, env=dict(env), process_group=0, cwd=cwd, stdin=stdin, stdout=stdout,
            stderr=stderr,
        )  # fmt: skip
        group.append(child.pid)
        if tty is not None:
            _give_terminal(tty, child.pid)
        watch = None
        if held is not None or deadline is not None:
            watch = _Watch(held, child.pid, grace_s, lost, deadline=deadline, late=late)
        try:
            code = _wait_for(child) if tty is None else _wait_in_foreground(child, tty)
        finally:
            if watch is not None:
                watch.close()
            if tty is not None:
                _give_terminal(tty, os.getpgrp())
            end_group(child.pid, grace_s)
    if watch is None:
        return JobEnd(code, False, False)
    return JobEnd(code, watch.timed_out, watch.ended)


class _Watch:
    """A thread that ends process group ``pgid`` once ``held()`` turns false, or once the
    clock passes ``deadline`` (then ``timed_out`` is set)."""

    def __init__(
        self,
        held: Callable[[], bool] | None,
        pgid: int,
        grace_s: float,
        lost: Callable[[], str],
        *,
        deadline: float | None = None,
        late: str = "",
    ) -> None:
        self._held, self._pgid, self._grace_s, self._lost = held, pgid, grace_s, lost
        self._deadline, self._late = deadline, late
        self.timed_out = False
        self.ended = False  # held() turned false, and the group was ended for it
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hwpool-run-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        if not self._watch():
            return
        _signal_group(self._pgid, signal.SIGTERM)
        _signal_group(self._pgid, signal.SIGCONT)
        if not self._done.wait(self._grace_s):
            _signal_group(self._pgid, signal.SIGKILL)

    def _watch(self) -> bool:
        """Wait until the job must be ended (True, after saying why) or has ended (False)."""
        deadline = self._deadline
        while True:
            pause = WATCH_S if deadline is None else max(0.0, min(WATCH_S, deadline - _now()))
            if self._done.wait(pause):
                return False
            if deadline is not None and _now() >= deadline:
                self.timed_out = True  # before the signal: the job may exit at once
                say(self._late)
                return True
            if self._held is not None and not self._held():
                self.ended = True
                say(self._lost())
                return True


def _now() -> float:
    return time.monotonic()


def _wait_for(child: subprocess.Popen[bytes]) -> int:
    """Wait for ``child`` to exit, waking every SIGNAL_SLICE_S: CPython runs a signal's
    handler (here: forwarding it to the job) only between two bytecodes, so a signal that
    lands as this thread goes to sleep in ``waitpid`` (or on another thread) would wait for
    the job's end. Where ``pidfd_open`` is missing, a plain wait."""
    try:
        pidfd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        return child.wait()
    try:
        while child.poll() is None:
            select.select([pidfd], [], [], SIGNAL_SLICE_S)  # readable once it has exited
    finally:
        os.close(pidfd)
    return child.returncode


def _wait_in_foreground(child: subprocess.Popen[bytes], tty: int) -> int:
    """Wait for ``child``, which owns the terminal; when Ctrl-Z stops it, stop this process too
    (the shell then sees the job stopped), and on ``fg`` give it the terminal and go on."""
    while True:
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            child.returncode = os.waitstatus_to_exitcode(status)
            return child.returncode
        _give_terminal(tty, os.getpgrp())
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here until the shell continues us
        _give_terminal(tty, child.pid)
        _signal_group(child.pid, signal.SIGCONT)


@contextlib.contextmanager
def _forwarding() -> Iterator[list[int]]:
    """While inside, the FORWARDED signals go to the process group appended to the list;
    an ignored one (``nohup``, a shell's ``&``) stays ignored, and the child inherits that."""
    group: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group[0], signum)

    previous = {
        signum: signal.signal(signum, forward)
        for signum in FORWARDED
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield group
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _foreground_tty() -> int | None:
    """stdin's descriptor when it is a terminal whose foreground group is this process's."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _give_terminal(fd: int, pgid: int) -> None:
    """Make ``pgid`` the terminal's foreground group (SIGTTOU held off: this process may be
    in the background by then)."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgid)
    finally:
        signal.signal(signal.SIGTTOU, previous)


def end_group(pgid: int, grace_s: float) -> None:
    """End what is left of process group ``pgid``: SIGTERM, then SIGKILL after ``grace_s``;
    return once no live process is left in it (bounded: zombies nobody reaps do not count)."""
    if not group_alive(pgid):
        return
    _signal_group(pgid, signal.SIGTERM)
    _signal_group(pgid, signal.SIGCONT)  # a stopped process acts on SIGTERM once continued
    if _wait_gone(pgid, grace_s):
        return
    _signal_group(pgid, signal.SIGKILL)
    _wait_gone(pgid, KILL_WAIT_S)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _wait_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.002
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)  # polling with backoff: the kernel has no wait for a group's end
        delay = min(2 * delay, 0.05)
    return True


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a live member. On Linux zombies do not count (a
    process whose parent never reaps it holds no GPU); elsewhere any member counts."""
    if not Path("/proc/self/stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return bool(ProcFS().members(pgid))
