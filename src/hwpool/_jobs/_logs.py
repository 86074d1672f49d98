"""Reading a job's captured output (``hwpool logs``, ``Job.logs()``), without trusting the path.

The launcher writes each job's stdout and stderr to the files its record names
(``<state dir>/logs/j3.out``, ``j3.err``, mode 0600). They are opened here with
``O_NOFOLLOW`` (a symbolic link planted in their place is refused, never followed) and
without blocking (a FIFO cannot stall the reader), then checked with ``fstat``: a regular
file of this user's that no one else may write; the folder holding it must be a real
directory of the user's too. Anything else raises :class:`UnsafePathError` naming the path.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from .._wire._safety import UnsafePathError, user_name
from ._model import JobRecord, JobState

__all__ = ["LogNotStartedError", "log_path", "open_log", "read_log"]

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
CHUNK = 1 << 16


class LogNotStartedError(LookupError):
    """The job has no output to show: it has not started (or never did)."""


def log_path(record: JobRecord, stderr: bool = False) -> Path:
    """The path of the job's stdout (or ``stderr``) log; LogNotStartedError when the job has
    none because it has not started, or ended without starting."""
    path = record.stderr_log if stderr else record.stdout_log
    if path is not None:
        return Path(path)
    if record.state in (JobState.QUEUED, JobState.WAITING):
        raise LogNotStartedError(
            f"{record.id} has not started ({record.state.value}): it has no output yet"
        )
    if record.started_at is None:
        raise LogNotStartedError(
            f"{record.id} never started ({record.state.value}): it has no output"
        )
    which = "stderr" if stderr else "stdout"
    raise LogNotStartedError(f"{record.id} has no {which} log recorded")


def open_log(path: Path) -> int:
    """A descriptor to read the log ``path`` from, once it passed the checks of the module
    (close-on-exec, blocking); UnsafePathError naming the path otherwise, FileNotFoundError
    when it is missing."""
    _check_folder(path.parent)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _unsafe(path, "is a symbolic link (never followed)") from None
        raise
    try:
        problem = _file_problem(os.fstat(fd))
        if problem is not None:
            raise _unsafe(path, problem)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_log(record: JobRecord, stderr: bool = False) -> bytes:
    """All the job's stdout (or ``stderr``) so far; LogNotStartedError, UnsafePathError or
    FileNotFoundError as :func:`log_path` and :func:`open_log` say."""
    fd = open_log(log_path(record, stderr))
    with os.fdopen(fd, "rb") as file:
        return file.read()


def _check_folder(folder: Path) -> None:
    """The log's folder: a real directory of this user's that no one else may write."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        return  # the open below says the log is missing
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise _unsafe(folder, "is not a real directory (a symbolic link, or a file)", "logs")
    if info.st_uid != os.geteuid():
        raise _unsafe(folder, f"belongs to {user_name(info.st_uid)}, not to you", "logs")
    if info.st_mode & _OTHERS_WRITE:
        mode = stat.S_IMODE(info.st_mode)
        raise _unsafe(folder, f"is writable by others (mode {mode:04o})", "logs")


def _file_problem(info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return f"belongs to {user_name(info.st_uid)}, not to you"
    if info.st_mode & _OTHERS_WRITE:
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _unsafe(path: Path, problem: str, what: str = "log") -> UnsafePathError:
    return UnsafePathError(
        f"the job's {what} {str(path)!r} {problem}: refusing to read it (someone may have "
        "planted it; remove it)"
    )
