"""Start a process on a chosen pid: force a pid wrap through ``/proc/sys/kernel/ns_last_pid``.

The kernel gives a new process the pid after ``ns_last_pid`` (when it is free), so writing
``pid - 1`` there and forking at once hands ``pid`` to the child: the way to make another
user's process take the pid of one that has ended, as the kernel does by itself on a busy
machine. Only root (in the initial pid namespace, or with CAP_CHECKPOINT_RESTORE) may write
it; :func:`need_pid_wrap` skips the test elsewhere, saying why. Another process of the machine
may fork in between and take the pid first: the child is then ended and the try repeated, a
bounded number of times.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
TRIES = 200  # forks by other processes in between each cost one try


def need_pid_wrap() -> None:
    """Skip the test unless this process may choose the next pid (root, ns_last_pid)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to choose a pid through /proc/sys/kernel/ns_last_pid")
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip(f"{NS_LAST_PID} is not writable here (no pid wrap can be forced)")


def popen_at_pid(
    pid: int, argv: Sequence[str], *, after: int | None = None, **popen: Any
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **popen)`` whose process has pid ``pid`` (which must be free:
    its last holder ended and was reaped). ``after``: the start time of that last holder
    (clock ticks after boot): the new process starts in a later tick, as a pid reused on a
    real machine does (a start time tells two processes apart only a tick apart).
    AssertionError after :data:`TRIES` misses."""
    if after is not None:
        _wait_past_tick(after)
    for _ in range(TRIES):
        fd = os.open(NS_LAST_PID, os.O_WRONLY)
        try:
            os.write(fd, str(pid - 1).encode())
        finally:
            os.close(fd)
        proc = subprocess.Popen(list(argv), **popen)
        if proc.pid == pid:
            return proc
        proc.kill()  # another fork took the pid first (or it is not free): try again
        proc.communicate(timeout=10)
    raise AssertionError(f"could not start a process on pid {pid} in {TRIES} tries")


def boot_tick() -> int:
    """The boot clock now, in clock ticks: a process started before now started at or
    before this tick."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _wait_past_tick(start: int) -> None:
    """Wait (bounded: a tick is 10 ms or less) until the boot clock is past tick ``start``."""
    deadline = time.monotonic() + 10
    while boot_tick() < start + 2:
        assert time.monotonic() < deadline, "the boot clock does not move"
        time.sleep(0.005)
