"""The job table's schema and its set-up: the SQL, the version, and a job from its row.

The schema is versioned with ``PRAGMA user_version`` (:data:`SCHEMA_VERSION`): an empty file
gets the schema, a table of this version is used as it is, one of a newer hwpool is refused
(never rewritten), and a database with other tables is refused as not a job table. A later
version adds its migration here, run in the same transaction that bumps the version.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from ._depends import DependencyKind
from ._model import JobRecord, JobState, Usage, format_job_id

__all__ = [
    "BUSY_TIMEOUT_S", "SCHEMA_VERSION", "JobTableError", "connect", "display_id", "job_from_row",
    "read_as_current",
]  # fmt: skip

SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 30.0  # how long a write waits for another process's transaction

_STATES = ", ".join(f"'{state.value}'" for state in JobState)
_KINDS = ", ".join(f"'{kind.value}'" for kind in DependencyKind)
_SCHEMA = f"""
CREATE TABLE jobs (
    number      INTEGER PRIMARY KEY AUTOINCREMENT,  -- the id's number: never reused
    name        TEXT NOT NULL,
    argv        TEXT NOT NULL,                      -- JSON list of strings
    cwd         TEXT NOT NULL,
    environment TEXT NOT NULL,                      -- JSON object (secrets: the file is 0600)
    gpus        TEXT,                               -- '1/4', '1', '3' (NULL: memory_mib)
    memory_mib  INTEGER,
    priority    INTEGER NOT NULL,
    time_limit  INTEGER,                            -- seconds; NULL: none
    state       TEXT NOT NULL CHECK (state IN ({_STATES})),
    exit_code   INTEGER,
    signal      INTEGER,
    gpu_ids     TEXT NOT NULL DEFAULT '[]',         -- JSON list: CUDA_VISIBLE_DEVICES
    lease       INTEGER,                            -- the host server's request id
    pid         INTEGER,
    pid_start   INTEGER,                            -- /proc/PID/stat field 22
    queued_at   REAL NOT NULL,
    started_at  REAL,
    ended_at    REAL,
    reason      TEXT,
    stdout_log  TEXT,
    stderr_log  TEXT,
    retry_of    INTEGER,
    held_by     TEXT,                               -- who holds it (hwpool hold); NULL: none
    gpu_share   REAL,                               -- GPUs it held (0.5, 2): its GPU-seconds' rate
    cpu_user_s  REAL,                               -- its process tree's CPU time (getrusage)
    cpu_system_s REAL,
    max_rss_kib INTEGER,                            -- its largest process's peak RSS
    ended_by    TEXT,                               -- who cancelled it
    notify      TEXT,                               -- run when it ends (submit --notify)
    notified_at REAL,                               -- when that was started
    array_of    INTEGER,                            -- its array's number (submit --array)
    array_index INTEGER,                            -- its index in the array
    array_limit INTEGER,                            -- at most that many members running
    CHECK ((gpus IS NULL) <> (memory_mib IS NULL))
);
CREATE TABLE dependencies (
    job      INTEGER NOT NULL REFERENCES jobs (number) ON DELETE CASCADE,
    after    INTEGER NOT NULL,  -- no foreign key: a record outlives its pruned dependency
    position INTEGER NOT NULL,
    kind     TEXT NOT NULL DEFAULT 'ok' CHECK (kind IN ({_KINDS})),
    PRIMARY KEY (job, after)
) WITHOUT ROWID;
CREATE INDEX jobs_by_state ON jobs (state, number);
CREATE INDEX dependencies_by_after ON dependencies (after);
CREATE INDEX jobs_by_array ON jobs (array_of, array_index);
"""

_MIGRATIONS = {
    1: [  # to 2 (issue 38): holds, dependency kinds (--after-any, --after-notok), accounting
        "ALTER TABLE jobs ADD COLUMN held_by TEXT",
        "ALTER TABLE jobs ADD COLUMN gpu_share REAL",
        "ALTER TABLE jobs ADD COLUMN cpu_user_s REAL",
        "ALTER TABLE jobs ADD COLUMN cpu_system_s REAL",
        "ALTER TABLE jobs ADD COLUMN max_rss_kib INTEGER",
        "ALTER TABLE jobs ADD COLUMN ended_by TEXT",
        "ALTER TABLE jobs ADD COLUMN notify TEXT",
        "ALTER TABLE jobs ADD COLUMN notified_at REAL",
        "ALTER TABLE jobs ADD COLUMN array_of INTEGER",
        "ALTER TABLE jobs ADD COLUMN array_index INTEGER",
        "ALTER TABLE jobs ADD COLUMN array_limit INTEGER",
        "CREATE INDEX jobs_by_array ON jobs (array_of, array_index)",
        f"ALTER TABLE dependencies ADD COLUMN kind TEXT NOT NULL DEFAULT 'ok' "
        f"CHECK (kind IN ({_KINDS}))",
    ],
}
"""Per version, the statements that bring a table of it to the next one."""


class JobTableError(RuntimeError):
    """The job table cannot be used: not a database, or from a newer hwpool."""


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the job table ``path`` (autocommit: callers open their transactions)
    in WAL mode with durable commits, its schema made or checked; JobTableError otherwise."""
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    connection.row_factory = sqlite3.Row
    try:
        _set_up(connection, path)
    except BaseException:
        connection.close()
        raise
    return connection


def _set_up(connection: sqlite3.Connection, path: Path) -> None:
    """WAL mode, durable commits, and the schema (made once, by whoever comes first: the
    check and the creation are one ``BEGIN IMMEDIATE`` transaction)."""
    try:
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("PRAGMA foreign_keys=ON")
        connection.execute("BEGIN IMMEDIATE")
        try:
            _create_or_check_schema(connection, path)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise JobTableError(
            f"the job table {str(path)!r} cannot be used: {exc} (move it away to start a new one)"
        ) from None
    if mode != "wal":
        raise JobTableError(f"the job table {str(path)!r} refused WAL mode ({mode})")


def _create_or_check_schema(connection: sqlite3.Connection, path: Path) -> None:
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise JobTableError(
            f"the job table {str(path)!r} was made by a newer hwpool (schema {version}; this "
            f"one knows {SCHEMA_VERSION}): upgrade hwpool"
        )
    if version in _MIGRATIONS and _is_job_table(connection):
        for old in range(version, SCHEMA_VERSION):
            for statement in _MIGRATIONS[old]:
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        return
    if connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise JobTableError(
            f"{str(path)!r} is a database but not hwpool's job table (move it away)"
        )
    # statement by statement: executescript would commit the open transaction first
    for statement in _SCHEMA.split(";\n"):
        if statement.strip():
            connection.execute(statement)
    connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


_READ_AS_CURRENT = {
    1: [
        "CREATE TEMP VIEW jobs AS SELECT *, NULL AS held_by, NULL AS gpu_share, NULL AS "
        "cpu_user_s, NULL AS cpu_system_s, NULL AS max_rss_kib, NULL AS ended_by, "
        "NULL AS notify, NULL AS notified_at, NULL AS array_of, NULL AS array_index, "
        "NULL AS array_limit FROM main.jobs",
        "CREATE TEMP VIEW dependencies AS SELECT *, 'ok' AS kind FROM main.dependencies",
    ],
}
"""Per older version, temporary views that let a read-only connection read a table of it as
one of this version (its owner's next command brings the file itself up to date)."""


def read_as_current(connection: sqlite3.Connection, path: Path) -> None:
    """Let the read-only ``connection`` to the job table ``path`` be read as this version's
    (temporary views over an older one: they shadow its tables, and write nothing to the
    file); JobTableError naming both versions for one it cannot read."""
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        return
    if version not in _READ_AS_CURRENT:
        raise JobTableError(
            f"the job table {str(path)!r} has schema {version}; this hwpool reads "
            f"{', '.join(map(str, [*_READ_AS_CURRENT, SCHEMA_VERSION]))}"
        )
    for statement in _READ_AS_CURRENT[version]:
        connection.execute(statement)


def _is_job_table(connection: sqlite3.Connection) -> bool:
    names = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    return {"jobs", "dependencies"} <= names


def job_from_row(row: sqlite3.Row, dependencies: Sequence[tuple[str, str]] = ()) -> JobRecord:
    """The :class:`JobRecord` of one row of ``jobs``; ``dependencies``: its ``(id, kind)``
    pairs in order."""
    gpus = row["gpus"]
    share = None if gpus is None else Fraction(gpus)
    return JobRecord(
        id=display_id(row["number"], row["array_of"], row["array_index"]),
        name=row["name"],
        argv=tuple(json.loads(row["argv"])),
        cwd=row["cwd"],
        environment=json.loads(row["environment"]),
        gpus=int(share) if share is not None and share.denominator == 1 and share > 1 else share,
        memory_mib=row["memory_mib"],
        priority=row["priority"],
        time_limit=row["time_limit"],
        after=_of_kind(dependencies, DependencyKind.OK),
        state=JobState(row["state"]),
        exit_code=row["exit_code"],
        signal=row["signal"],
        gpu_ids=tuple(json.loads(row["gpu_ids"])),
        lease=row["lease"],
        pid=row["pid"],
        pid_start=row["pid_start"],
        queued_at=row["queued_at"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        reason=row["reason"],
        stdout_log=row["stdout_log"],
        stderr_log=row["stderr_log"],
        retry_of=None if row["retry_of"] is None else format_job_id(row["retry_of"]),
        after_any=_of_kind(dependencies, DependencyKind.ANY),
        after_notok=_of_kind(dependencies, DependencyKind.NOTOK),
        held_by=row["held_by"],
        gpu_share=row["gpu_share"],
        usage=None
        if row["cpu_user_s"] is None
        else Usage(row["cpu_user_s"], row["cpu_system_s"], row["max_rss_kib"]),
        ended_by=row["ended_by"],
        notify=row["notify"],
        number=row["number"],
        array_id=None if row["array_of"] is None else format_job_id(row["array_of"]),
        array_index=row["array_index"],
        array_limit=row["array_limit"],
    )


def display_id(number: int, array_of: int | None, array_index: int | None) -> str:
    """A job's id as users see it: ``j12``, or ``j12_3`` for an array's member."""
    if array_of is None or array_index is None:
        return format_job_id(number)
    return f"{format_job_id(array_of)}_{array_index}"


def _of_kind(dependencies: Sequence[tuple[str, str]], kind: DependencyKind) -> tuple[str, ...]:
    return tuple(job_id for job_id, of in dependencies if of == kind)
