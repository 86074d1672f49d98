"""Where a user's job files live, and the rules for trusting them.

The state directory is ``HWPOOL_STATE_DIR`` (for tests and unusual set-ups), else
``$XDG_STATE_HOME/hwpool`` (when it is an absolute path, as the XDG spec requires), else
``~/.local/state/hwpool``. It holds the job table (``jobs.db``, with sqlite's ``-wal`` and
``-shm`` beside it), the jobs' logs (``logs/``) and the supervisor's files.

The table holds each job's environment, secrets included, so the directory and the table
are the user's alone: the directory is created mode 0700, and is checked the way the host
server's socket directory is (``hwpool._wire._safety.check_directory``: a real directory
owned by the user that neither group nor others may write, every directory above it
trusted), and besides that readable by no one else; the table is opened as the server's
side files are (``open_side_file``: never through a symbolic link, a regular file of the
user's, one link) and must be readable by no one else either. Anything else is refused with
:class:`UnsafePathError` naming the path, never repaired.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .._check import duration_from_text, int_from_text
from .._core._memory import parse_memory
from .._wire._safety import UnsafePathError, _side_file_problem, check_directory, open_side_file

__all__ = [
    "DEFAULT_KEEP_COUNT",
    "DEFAULT_KEEP_SECONDS",
    "KEEP_COUNT_VAR",
    "KEEP_VAR",
    "LOCK_NAME",
    "LOG_MAX_VAR",
    "LOG_NAME",
    "SOCKET_NAME",
    "STATE_DIR_VAR",
    "TABLE_NAME",
    "keep_from_env",
    "log_cap_from_env",
    "open_table_file",
    "prepare_state_directory",
    "state_directory",
]

STATE_DIR_VAR = "HWPOOL_STATE_DIR"
KEEP_VAR = "HWPOOL_JOBS_KEEP"  # how long finished jobs are kept (a duration: 7d, 12h)
KEEP_COUNT_VAR = "HWPOOL_JOBS_KEEP_COUNT"  # how many finished jobs are kept at most
LOG_MAX_VAR = "HWPOOL_JOBS_LOG_MAX"  # each job log's cap: a size (1GiB, 500M) or unlimited
DEFAULT_LOG_MAX = "1GiB"
DEFAULT_KEEP_SECONDS = 7 * 86400.0
DEFAULT_KEEP_COUNT = 1000
TABLE_NAME = "jobs.db"
LOCK_NAME = "supervisor.lock"  # held by the running supervisor; its pid and server inside
SOCKET_NAME = "supervisor.sock"  # a connection to it wakes the supervisor
LOG_NAME = "supervisor.log"  # what the supervisor says
_PRIVATE = stat.S_IRWXG | stat.S_IRWXO


def state_directory(environ: Mapping[str, str] | None = None) -> Path:
    """The user's hwpool state directory (see the module); ValueError for a relative
    ``HWPOOL_STATE_DIR``."""
    env = os.environ if environ is None else environ
    explicit = env.get(STATE_DIR_VAR)
    if explicit:
        if not os.path.isabs(explicit):
            raise ValueError(f"{STATE_DIR_VAR} must be an absolute path, got {explicit!r}")
        return Path(explicit)
    xdg = env.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "hwpool"
    return Path(env.get("HOME") or os.path.expanduser("~")) / ".local" / "state" / "hwpool"


def prepare_state_directory(directory: Path) -> Path:
    """``directory``, created mode 0700 if missing (its missing parents as ``mkdir -p``
    makes them), once it passes the rules of the module; UnsafePathError naming it
    otherwise."""
    if not os.path.lexists(directory):
        directory.parent.mkdir(parents=True, exist_ok=True)
        # made meanwhile (by another process of the user's): checked below like any other
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    try:
        info = check_directory(directory, {os.geteuid()})
    except UnsafePathError as exc:
        raise UnsafePathError(f"hwpool's job state directory is unsafe: {exc}") from None
    if info.st_mode & _PRIVATE:
        raise UnsafePathError(
            f"hwpool's job state directory {str(directory)!r} may be read by others (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): it holds your jobs' environments; make it "
            f"yours alone (chmod 700 {str(directory)!r})"
        )
    return directory


def open_table_file(path: Path) -> int:
    """Create or open the job table ``path`` and check it (see the module): a descriptor of
    it, which the store keeps as long as its connection and closes after it.

    Where the system has ``O_PATH`` (Linux) the descriptor is an ``O_PATH`` one, and only
    such a descriptor may be closed while this process has another connection to the table
    (a second store open in the same process: ``hwpool.Job``'s calls, a thread's): closing
    any other descriptor of a file drops every POSIX lock the process holds on it, sqlite's
    included, and a WAL table whose readers lost their lock may be checkpointed and its log
    removed under them by another process ("database disk image is malformed")."""
    if not hasattr(os, "O_PATH"):
        return _checked_table(open_side_file(path, os.O_RDWR | os.O_CREAT, mode=0o600,
                                             what="job table"), path)  # fmt: skip
    create = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    # a new table: closing the descriptor of a file just made drops no one's lock; if
    # something is there already (a table, or anything else), it is checked below
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, create, 0o600))
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafePathError(f"the job table {str(path)!r} vanished while opened") from None
    info = os.fstat(fd)
    if stat.S_ISLNK(info.st_mode):
        os.close(fd)
        raise UnsafePathError(
            f"the job table {str(path)!r} is a symbolic link (never followed: it could make "
            "the server write another file): refusing to use it (remove it; someone else may "
            "have planted it)"
        )
    problem = _side_file_problem(info, os.geteuid())
    if problem is not None:
        os.close(fd)
        raise UnsafePathError(
            f"the job table {str(path)!r} {problem}: refusing to use it (remove it; someone "
            "else may have planted it)"
        )
    return _checked_table(fd, path)


def _checked_table(fd: int, path: Path) -> int:
    """``fd`` of the table ``path`` if no one else may read it (else closed, and raise)."""
    mode = os.fstat(fd).st_mode
    if mode & _PRIVATE:
        os.close(fd)
        raise UnsafePathError(
            f"the job table {str(path)!r} may be read by others (mode "
            f"{stat.S_IMODE(mode):04o}): it holds your jobs' environments; make it yours "
            f"alone (chmod 600 {str(path)!r})"
        )
    return fd


def keep_from_env(environ: Mapping[str, str]) -> tuple[float, int]:
    """The retention of finished jobs: ``HWPOOL_JOBS_KEEP`` (a duration, default a week) and
    ``HWPOOL_JOBS_KEEP_COUNT`` (an int >= 0, default 1000); ValueError naming the variable
    and its value when one is malformed."""
    seconds, count = DEFAULT_KEEP_SECONDS, DEFAULT_KEEP_COUNT
    raw = environ.get(KEEP_VAR)
    if raw:
        try:
            seconds = duration_from_text(raw)
        except ValueError as exc:
            raise ValueError(f"{KEEP_VAR}: {exc}") from None
    raw = environ.get(KEEP_COUNT_VAR)
    if raw:
        count = int_from_text(KEEP_COUNT_VAR, raw, minimum=0, maximum=2**31)
    return seconds, count


def log_cap_from_env(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """The cap of each job log (stdout and stderr each), in bytes (None: ``unlimited``), and
    as written: ``HWPOOL_JOBS_LOG_MAX``, a size with a binary unit (``1GiB``, ``500M``;
    at least 1 MiB), default :data:`DEFAULT_LOG_MAX`; ValueError naming the variable and
    its value when it is malformed."""
    raw = environ.get(LOG_MAX_VAR) or DEFAULT_LOG_MAX
    if raw.strip() == "unlimited":
        return None, "unlimited"
    try:
        mib = parse_memory(raw, LOG_MAX_VAR)
    except ValueError:
        raise ValueError(
            f"{LOG_MAX_VAR} must be a size with a binary unit ('1GiB', '500M', '1.5G': at "
            f"least 1 MiB) or 'unlimited', got {raw!r}"
        ) from None
    return mib << 20, raw.strip()
