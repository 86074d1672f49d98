"""The admin's view: another user's job table, read by root without changing anything.

Root reads ``~NAME/.local/state/hwpool/jobs.db`` (the default state directory; a user's own
``HWPOOL_STATE_DIR`` or ``XDG_STATE_HOME`` cannot be known from outside). Nothing in the
user's directory is created or modified, and nothing there is trusted that the user's own
commands would not trust: the directory must pass the checks of ``_state`` for *that* user
(a real directory of theirs, no one else may write or read it, every directory above it
trusted), and the table is opened as their own commands open it (never through a symbolic
link, a regular file of theirs, one link, readable by no one else) before sqlite reads it.

How sqlite is kept from writing: a WAL table that no process has open has no ``-wal`` file
(the last connection to close checkpoints it and removes it); it is then read as
``immutable`` (no lock, no ``-shm``, nothing created), and read again if a writer came and
went meanwhile (the file's size or time changed, or a ``-wal`` appeared). A table in use
has its ``-wal`` and ``-shm``; it is read with ``mode=ro`` through them, as any reader does
(a reader's place is marked in ``-shm``'s shared memory; no file is created, the table and
its log are not written).
"""

from __future__ import annotations

import os
import pwd
import sqlite3
import stat
from pathlib import Path
from urllib.parse import quote

from .._wire._safety import UnsafePathError, check_directory, open_side_file
from ._model import JobRecord
from ._schema import JobTableError, read_as_current
from ._state import TABLE_NAME
from ._store import JobStore

__all__ = ["default_state_directory", "read_user_jobs"]

_PRIVATE = stat.S_IRWXG | stat.S_IRWXO
_TRIES = 5


def default_state_directory(user: pwd.struct_passwd) -> Path:
    """``user``'s default state directory: ``~NAME/.local/state/hwpool``."""
    return Path(user.pw_dir) / ".local" / "state" / "hwpool"


def read_user_jobs(user: pwd.struct_passwd, *, include_finished: bool) -> list[JobRecord]:
    """``user``'s jobs, newest first (as :meth:`JobStore.list`), from their default state
    directory; none when they have no table. UnsafePathError for a directory or table that
    fails the checks of the module; JobTableError for one that cannot be read (a corrupt
    file, a newer schema, or one row with a value this hwpool cannot read: the user can
    write any value into their own table, so no row of it is trusted to parse)."""
    directory = default_state_directory(user)
    table = directory / TABLE_NAME
    if not os.path.lexists(directory):
        return []
    _check_directory(directory, user)
    if not os.path.lexists(table):
        return []
    fd = open_side_file(table, os.O_RDONLY, owner=user.pw_uid, what="job table")
    try:
        checked = os.fstat(fd)
        if checked.st_mode & _PRIVATE:
            raise UnsafePathError(
                f"{user.pw_name}'s job table {str(table)!r} may be read by others (mode "
                f"{stat.S_IMODE(checked.st_mode):04o}): not reading it"
            )
        for _ in range(_TRIES):
            found = _read_once(table, checked, include_finished)
            if found is not None:
                return found
    finally:
        os.close(fd)
    raise JobTableError(f"{user.pw_name}'s job table {str(table)!r} kept changing while read")


def _check_directory(directory: Path, user: pwd.struct_passwd) -> None:
    """UnsafePathError naming ``directory`` unless it passes the rules of ``_state`` for
    ``user``."""
    try:
        info = check_directory(directory, {user.pw_uid})
    except UnsafePathError as exc:
        raise UnsafePathError(f"{user.pw_name}'s job state directory is unsafe: {exc}") from None
    if info.st_mode & _PRIVATE:
        raise UnsafePathError(
            f"{user.pw_name}'s job state directory {str(directory)!r} may be read by others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}): not reading it"
        )


def _read_once(
    table: Path, checked: os.stat_result, include_finished: bool
) -> list[JobRecord] | None:
    """One read of the table (see the module); None when it changed under the read and
    must be read again."""
    wal = table.with_name(table.name + "-wal")
    shm = table.with_name(table.name + "-shm")
    in_use = os.path.lexists(wal)
    if in_use and not os.path.lexists(shm):
        raise JobTableError(
            f"the job table {str(table)!r} has a write-ahead log but no index (-shm): its "
            "owner's next command will recover it; not reading it meanwhile"
        )
    before = os.lstat(table)
    if (before.st_dev, before.st_ino) != (checked.st_dev, checked.st_ino):
        return None  # renamed or replaced since it was checked: check the new one
    option = "mode=ro" if in_use else "immutable=1"
    connection = sqlite3.connect(
        f"file:{quote(str(table))}?{option}", uri=True, isolation_level=None, timeout=5.0
    )
    try:
        connection.row_factory = sqlite3.Row
        read_as_current(connection, table)
        jobs = JobStore(connection, table).list(include_finished=include_finished)
    except sqlite3.DatabaseError as exc:
        raise JobTableError(f"the job table {str(table)!r} cannot be read: {exc}") from None
    except (ValueError, TypeError, KeyError) as exc:  # a bad value in a row of the user's
        raise JobTableError(
            f"the job table {str(table)!r} has a row that cannot be read: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    finally:
        connection.close()
    after = os.lstat(table)
    same = (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns,
    )  # fmt: skip
    if not in_use and (not same or os.path.lexists(wal)):
        return None
    return jobs if after.st_ino == before.st_ino else None
