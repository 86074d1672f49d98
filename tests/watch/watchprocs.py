"""Real processes for the watcher's tests: a job in a session of its own whose child moved to
a session of its own too, and a bystander outside any lease."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

_JOB = """
import subprocess, sys
child = subprocess.Popen(["sleep", "120"], start_new_session=True)
print(child.pid, flush=True)
sys.stdin.read()
child.kill()
child.wait()
"""


@dataclass(frozen=True)
class Job:
    """A job (``pid``: the leader of its own session and group) and its ``child``, which
    started a session of its own: only the parent chain links it to the job."""

    pid: int
    child: int


@contextlib.contextmanager
def running_job() -> Iterator[Job]:
    """Start a job; its child's pid is read from its stdout (the test's timeout bounds the
    wait). Closing its stdin ends both."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _JOB],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        yield Job(proc.pid, int(proc.stdout.readline()))
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def bystander() -> Iterator[int]:
    """A process outside every lease (a child of the test itself): its pid."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def absent_pid() -> int:
    """A pid that names no process here: above the kernel's largest (``pid_max``)."""
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


@dataclass(frozen=True)
class Nested:
    """A process in a pid namespace of its own: its pid here (``pid``), its pid there
    (``inner``) and that namespace (``ns``, the inode of its ``/proc/PID/ns/pid``)."""

    pid: int
    inner: int
    ns: int


_NESTED = "sleep 120 & echo $!; wait"


@contextlib.contextmanager
def nested_process() -> Iterator[Nested]:
    """``unshare --pid --fork`` (root only): a shell, pid 1 of a new pid namespace, and its
    child ``sleep``, whose pid there the shell prints once it has started it (the test's
    timeout bounds the wait); found here as the shell's child."""
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "sh", "-c", _NESTED],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        inner = int(proc.stdout.readline())
        (shell,) = _children(proc.pid)
        (pid,) = _children(shell)
        yield Nested(pid, inner, os.stat(f"/proc/{pid}/ns/pid").st_ino)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if name.isdigit() and fields[1] == str(pid):
            found.append(int(name))
    return found
