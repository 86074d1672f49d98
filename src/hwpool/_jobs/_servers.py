"""Which host server a user's jobs wait on: the one their supervisor was started for.

A supervisor serves one server, the one the shell that started it chose (``--socket``,
``HWPOOL_SOCKET``, else the machine-wide server, else the per-user one), and says which in
its lock file (``supervisor.lock``: its pid, then that socket). ``hwpool submit`` queues a
job only for the server its own shell chose: when the supervisor serves another one (it
runs, or it died leaving jobs queued for it, which the next supervisor would ask for),
the submit is refused naming both sockets, and nothing is queued (issue 35: the job used
to run on whichever server the supervisor had been started for).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from .._wire._safety import open_side_file
from ._model import JobState
from ._state import LOCK_NAME
from ._store import JobStore

__all__ = ["ServerConflictError", "Serving", "check_server", "lock_text", "serving"]

MAX_LOCK_TEXT = 4096


class ServerConflictError(ValueError):
    """The shell chose a server other than the one the user's supervisor serves."""


@dataclass(frozen=True)
class Serving:
    """What the lock file says: the socket the last supervisor served (None: not said, a
    supervisor of an older hwpool), and whether a supervisor holds the lock now."""

    socket: Path | None
    running: bool


def lock_text(pid: int, socket: Path) -> bytes:
    """What a supervisor writes in its lock file: its pid, then the socket it serves."""
    return f"{pid}\n{socket}\n".encode()


def serving(directory: Path) -> Serving:
    """What ``directory``'s supervisor lock says (no lock file: nothing, nothing running).
    The lock is tried, shared and without waiting, to learn whether a supervisor holds it;
    UnsafePathError for a lock file that is not to be trusted."""
    try:
        fd = open_side_file(directory / LOCK_NAME, os.O_RDONLY, what="supervisor lock")
    except FileNotFoundError:
        return Serving(None, False)
    try:
        lines = os.read(fd, MAX_LOCK_TEXT).decode(errors="replace").splitlines()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            running = False
        except BlockingIOError:
            running = True
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    socket = Path(lines[1]) if len(lines) > 1 and os.path.isabs(lines[1]) else None
    return Serving(socket, running)


def check_server(directory: Path, store: JobStore | None, socket: Path) -> None:
    """ServerConflictError, naming both sockets, when jobs queued now would not wait on
    ``socket`` (the server this shell chose): the supervisor of ``directory`` runs for another
    server, or died leaving jobs queued for another (``store``: the table, when it exists)."""
    now = serving(directory)
    if now.socket is None or now.socket == socket:
        return
    if now.running:
        why = "your supervisor runs for it now"
    elif store is not None and store.list(states=[JobState.QUEUED, JobState.WAITING]):
        why = "jobs of yours are queued for it"
    else:
        return
    raise ServerConflictError(
        f"this shell chose the hwpool server at {str(socket)!r}, but your jobs go to the "
        f"one at {str(now.socket)!r} ({why}): submit with --socket {now.socket} (or "
        f"HWPOOL_SOCKET), or wait until those jobs have finished (hwpool jobs) and the "
        "supervisor has exited (a minute after its last job), then submit again"
    )
