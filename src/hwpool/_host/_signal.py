"""Signal one recorded process, never a later holder of its pid.

``kill(pid)`` after a check that the pid is still the process recorded is two steps: the
process may end in between and its pid go to another (another user's, for a root server).
A pidfd (``pidfd_open``, Linux 5.3 and later) closes that gap: it names the process that had
the pid when it was opened, for good, so a check made *after* opening it is a check of that
very process, and ``pidfd_send_signal`` reaches it or nothing (ESRCH once it has ended).
Where pidfds are missing (an older kernel, not Linux) the two steps remain, which is as good
as the check can be there; the caller is told nothing different.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

from ._procs import ProcessId, is_process, process_start

__all__ = ["signal_process", "signal_started"]


def signal_process(ident: ProcessId, signum: int) -> bool:
    """Send ``signum`` to the process ``ident`` names if it is still that process (the same
    pid, start time and uid); whether it was sent. Never raises for a process that is gone
    or not this process's to signal."""
    return _send(ident.pid, signum, lambda: is_process(ident))


def signal_started(pid: int, start: int, signum: int) -> bool:
    """Send ``signum`` to ``pid`` if it is still the process that started at ``start``
    (clock ticks after boot; whoever owns it: kill(2) decides that); whether it was sent."""
    return _send(pid, signum, lambda: process_start(pid) == start)


def _send(pid: int, signum: int, same: Callable[[], bool]) -> bool:
    """Open a pidfd of ``pid``, then, if ``same()`` (asked after the open), signal it."""
    try:
        pidfd = _pidfd(pid)
    except ProcessLookupError:
        return False
    try:
        if not same():
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if pidfd is None:
                os.kill(pid, signum)
            else:
                signal.pidfd_send_signal(pidfd, signum)
            return True
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid``, or None where pidfds are not available; ProcessLookupError if no
    such process."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError:  # ENOSYS (an older kernel), EPERM in some sandboxes: the two steps
        return None
