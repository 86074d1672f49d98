"""Which process a job's record names: a pid and its start time, and the signal that cancels.

A pid alone names a process only while it lives: once it ends, the kernel may give the same
pid to any later process. The job table therefore keeps each job launcher's pid with its
start time (field 22 of ``/proc/PID/stat``, in clock ticks after boot: read by
:mod:`hwpool._host._procs`, as the server and the watcher read it), and a process is the
recorded one only while both match. Where ``/proc`` is missing (not Linux) the start time is
unknown (``None``) and a live pid is taken at its word.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from .._host._procs import process_start
from .._host._signal import signal_started

__all__ = ["CANCEL_SIGNAL", "is_running", "process_start", "signal_if_running"]

# What a job's launcher takes as "cancel this job": it then ends the job's process group
# (SIGTERM, SIGKILL after the grace) and records the job as cancelled. Not SIGTERM: a
# SIGTERM to the launcher is passed on to the job, as ``hwpool run`` passes it on.
CANCEL_SIGNAL = signal.SIGUSR1

_PROC = Path("/proc")


def is_running(pid: int, start: int | None) -> bool:
    """Whether the process recorded as ``pid`` started at ``start`` is still running (not a
    zombie). With no ``/proc`` (or no recorded start), whether a process ``pid`` exists."""
    if (_PROC / "self" / "stat").exists() and start is not None:
        return process_start(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_if_running(pid: int, start: int | None, signum: int) -> bool:
    """Send ``signum`` to ``pid`` if it is still the process recorded (see :func:`is_running`);
    whether it was sent. With ``/proc`` and a recorded start the check and the send name one
    process (through a pidfd where there is one: a pid reused in between is never reached);
    without, a live pid is taken at its word, and only the user's own processes can be
    reached (kill(2) refuses others')."""
    if start is not None and (_PROC / "self" / "stat").exists():
        return signal_started(pid, start, signum)
    if not is_running(pid, start):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
        return True
    return False
