"""The job table: one sqlite database per user (WAL mode), every change one transaction.

Who writes it: the user's supervisor (to come) and ``hwpool submit``; who reads it:
``hwpool jobs``, ``logs``, ``wait``. WAL lets readers go on while one process writes, and
each change below is one ``BEGIN IMMEDIATE`` transaction (its checks included), so a
process killed in the middle of one (SIGKILL, a power cut) leaves the table as it was
before it: there is never a job without its dependencies, a retry without its copy, or a
half-cancelled chain. Commits are synchronous (``synchronous=FULL``): once ``add`` returns,
the job is on disk, and the id printed to the user stands.

The transitions (see docs/jobs.md for the table)::

    add ──> queued ──mark_running──> running ──> succeeded | failed   (mark_finished)
                                             ──> timed-out | lost     (mark_timed_out, mark_lost)
    add ──> waiting-on-dependency ──ready──> queued
    queued, waiting-on-dependency, running ──> cancelled   (mark_cancelled; ready, when a
                                                            dependency can never be met)
    queued, waiting-on-dependency ──hold / release_hold──> the same, held or not
    a finished job ──retry──> a new job (queued or waiting) with a new id

A transition asked of a job in another state raises :class:`JobStateError` and changes
nothing. ``retry`` makes a new job (``retry_of`` names the old one) rather than requeueing
the same id: the old run keeps its exit code, times and logs, ids stay in submit order
(a dependency always has a smaller id than its dependents), and an id never names two runs.

The schema, its version and its set-up are ``_schema``'s; the checks of each field are
``_model``'s; where the file lives and whether it may be trusted, ``_state``'s.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any

from .._check import check_bool, check_int
from ._arrays import ArraySpec
from ._depends import DEPENDENCY_ENDS, Dependency, DependencyKind, verdict
from ._model import (
    FINISHED,
    MAX_SIGNAL,
    JobRecord,
    JobRef,
    JobState,
    Usage,
    check_after,
    check_argv,
    check_cwd,
    check_environment,
    check_exit,
    check_gpu_ids,
    check_name,
    check_optional_int,
    check_priority,
    check_reason,
    check_request,
    check_state,
    check_time,
    check_usage,
    format_job_id,
    how_ended,
    parse_job_ref,
)
from ._schema import SCHEMA_VERSION, JobTableError, connect, display_id, job_from_row
from ._state import (
    DEFAULT_KEEP_COUNT,
    DEFAULT_KEEP_SECONDS,
    TABLE_NAME,
    open_table_file,
    prepare_state_directory,
    state_directory,
)
from ._userconfig import check_notify

__all__ = ["DEFAULT_KEEP_COUNT", "DEFAULT_KEEP_SECONDS", "SCHEMA_VERSION", "JobStateError",
           "JobStore", "JobTableError", "UnknownJobError"]  # fmt: skip

_MAX_PID_START = 2**63 - 1

_DEPENDENCY_ENDS = DEPENDENCY_ENDS
_WAITING_OR_QUEUED = frozenset({JobState.QUEUED, JobState.WAITING})


class JobStateError(ValueError):
    """A transition asked of a job in a state it cannot leave that way."""


class UnknownJobError(LookupError):
    """No job with that id in the user's table (never made, or pruned)."""


class JobStore:
    """The user's job table. Open it with :meth:`open`; close it (or use ``with``).

    One instance belongs to one thread; any number of processes may open the same table.
    """

    def __init__(self, connection: sqlite3.Connection, path: Path, checked: int = -1) -> None:
        self._db = connection
        self.path = path
        # The descriptor the safety checks opened the table with stays open as long as the
        # connection: closing any descriptor of a file drops every POSIX lock this process
        # holds on it (fcntl(2)), sqlite's included, and a process that then saw the table
        # unlocked would take itself for its last user and remove the write-ahead log from
        # under this connection, whose commits nobody would see again.
        self._checked = checked

    # --------------------------------------------------------------- opening
    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> JobStore:
        """The job table in ``directory`` (default: :func:`state_directory`), created with
        its directory if missing, after the safety checks of ``_state`` (UnsafePathError);
        JobTableError for a file that is not a job table of this version."""
        chosen = state_directory(environ) if directory is None else Path(directory)
        folder = prepare_state_directory(chosen)
        path = folder / TABLE_NAME
        fd = open_table_file(path)
        try:
            return cls(connect(path), path, fd)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Close the table (what was committed stays)."""
        self._db.close()
        if self._checked >= 0:
            os.close(self._checked)
            self._checked = -1

    def __enter__(self) -> JobStore:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --------------------------------------------------------------- transactions
    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction, taken at once (``BEGIN IMMEDIATE``: no deadlock between
        two readers turning writers); rolled back on any exception, a failed ``COMMIT``
        included (the disk is full: sqlite may leave the transaction open, and every later
        ``BEGIN`` of this connection would fail), so that the next write may succeed."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        """End the open transaction, if any (sqlite ends it by itself after some errors)."""
        if self._db.in_transaction:
            with suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    @contextmanager
    def _read(self) -> Iterator[None]:
        """One read transaction: the queries inside it see one snapshot."""
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error:
                self._rollback()  # never a connection left inside a transaction
                raise

    def data_version(self) -> int:
        """A number that changes when another connection commits a change to the table
        (sqlite's ``PRAGMA data_version``): a cheap way to see whether to read it again."""
        with self._read():
            return int(self._db.execute("PRAGMA data_version").fetchone()[0])

    # --------------------------------------------------------------- adding
    def add(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str],
        environment: Mapping[str, str],
        name: str | None = None,
        gpus: Fraction | int | float | None = None,
        memory_mib: int | None = None,
        priority: int = 0,
        time_limit: int | None = None,
        after: Iterable[str] = (),
        after_any: Iterable[str] = (),
        after_notok: Iterable[str] = (),
        held_by: str | None = None,
        notify: str | None = None,
        now: float | None = None,
    ) -> JobRecord:
        """Queue a job; the job as recorded. It is ``queued`` when its dependencies are met
        (every job in ``after`` succeeded, every one in ``after_any`` ended, one in
        ``after_notok`` ended without success; see ``_depends``), else
        ``waiting-on-dependency``; ``held_by`` (a user's name) holds it from the start;
        ``notify``: a shell command to run once it has ended.

        Dependencies may name only jobs of this table (so never a later job: no cycle can
        form), each once, and only such that the job may still run; ValueError otherwise.
        See :class:`~._model.JobRecord` for the fields; bad values raise TypeError or
        ValueError and add nothing."""
        return self.add_all([(argv, name)], cwd=cwd, environment=environment, gpus=gpus,
                            memory_mib=memory_mib, priority=priority, time_limit=time_limit,
                            after=after, after_any=after_any, after_notok=after_notok,
                            held_by=held_by, notify=notify, now=now)[0]  # fmt: skip

    def add_all(
        self,
        commands: Sequence[tuple[Sequence[str], str | None]],
        *,
        cwd: str | os.PathLike[str],
        environment: Mapping[str, str],
        gpus: Fraction | int | float | None = None,
        memory_mib: int | None = None,
        priority: int = 0,
        time_limit: int | None = None,
        after: Iterable[str] = (),
        after_any: Iterable[str] = (),
        after_notok: Iterable[str] = (),
        held_by: str | None = None,
        notify: str | None = None,
        array: ArraySpec | None = None,
        now: float | None = None,
    ) -> builtins.list[JobRecord]:
        """Queue one job per ``(argv, name)`` of ``commands``, in that order, with the same
        other fields (as :meth:`add`), in one transaction: all of them, or (on any bad
        value) none; the jobs as recorded. ``array`` (with one command): one member per
        index, sharing the first member's number as the array's id (``_arrays``)."""
        shared = {
            "cwd": check_cwd(cwd),
            "environment": json.dumps(check_environment(environment)),
            "priority": check_priority(priority),
            "time_limit": check_optional_int("time_limit", time_limit, 1, 2**53),
            "queued_at": _now(now),
            "held_by": _check_holder(held_by),
            "notify": check_notify(notify),
        }
        share, memory = check_request(gpus, memory_mib)
        shared["gpus"] = None if share is None else str(share)
        shared["memory_mib"] = memory
        refs = _kinds(after, after_any, after_notok)
        rows = []
        for argv, name in commands:
            command = check_argv(argv)
            rows.append({**shared, "name": check_name(name, command),
                         "argv": json.dumps(command)})  # fmt: skip
        if array is not None:
            if not isinstance(array, ArraySpec) or len(rows) != 1 or not array.indices:
                raise ValueError(f"array: one command and an ArraySpec with indices, got {array!r}")
            rows = [{**rows[0], "array_index": index, "array_limit": array.limit}
                    for index in array.indices]  # fmt: skip
        with self._write():
            dependencies = self._resolved(refs)
            added = [self._insert(dict(fields), dependencies) for fields in rows]
            if array is None:
                return added
            self._db.execute(
                "UPDATE jobs SET array_of = ? WHERE number BETWEEN ? AND ?",
                (added[0].number, added[0].number, added[-1].number),
            )
            return [self._get(job.number) for job in added]

    def _resolved(
        self, refs: Sequence[tuple[JobRef, DependencyKind]]
    ) -> builtins.list[tuple[int, DependencyKind]]:
        """The rows the dependencies ``refs`` name (an array: each member's newest run), each
        once; ValueError naming the option for an unknown one or one given twice."""
        found: dict[int, DependencyKind] = {}
        for ref, kind in refs:
            try:
                if ref.member is None:
                    members = self._db.execute(
                        "SELECT max(number) FROM jobs WHERE array_of = ? GROUP BY array_index "
                        "ORDER BY array_index", (ref.number,),
                    ).fetchall()  # fmt: skip
                    numbers = [row[0] for row in members] or [ref.number]
                else:
                    numbers = [self._number(ref)]
            except UnknownJobError:
                raise ValueError(
                    f"{_OPTION[kind]}: no job {str(ref)!r} in your job table "
                    f"{str(self.path)!r} (a job can depend only on one of your own jobs that "
                    "exists)"
                ) from None
            for number in numbers:
                if number in found:
                    raise ValueError(
                        f"{_OPTION[kind]}: {str(ref)!r} is already a dependency "
                        f"({_OPTION[found[number]]}): give each job once"
                    )
                found[number] = kind
        return list(found.items())

    def _insert(
        self, fields: dict[str, Any], dependencies: Sequence[tuple[int, DependencyKind]]
    ) -> JobRecord:
        """Insert one job (inside a write transaction) after checking its dependencies."""
        found = [self._dependency(number, kind) for number, kind in dependencies]
        outcome = verdict(found)
        if outcome.never is not None:
            raise ValueError(
                f"after_notok: {outcome.never}, so this job could never run (give one that "
                "may still fail)"
            )
        fields["state"] = (JobState.QUEUED if outcome.ready else JobState.WAITING).value
        names = ", ".join(fields)
        marks = ", ".join(f":{key}" for key in fields)
        cursor = self._db.execute(f"INSERT INTO jobs ({names}) VALUES ({marks})", fields)
        number = cursor.lastrowid
        assert number is not None
        self._insert_dependencies(number, dependencies)
        return self._get(number)

    def _dependency(self, number: int, kind: DependencyKind) -> Dependency:
        """The dependency ``number`` of ``kind`` as it stands; ValueError if it is unknown,
        or (``after``) can no longer succeed."""
        row = self._db.execute(
            "SELECT state, exit_code, signal FROM jobs WHERE number = ?", (number,)
        ).fetchone()
        job_id = format_job_id(number)
        option = _OPTION[kind]
        if row is None:
            raise ValueError(
                f"{option}: no job {job_id!r} in your job table {str(self.path)!r} (a job can "
                "depend only on one of your own jobs that exists)"
            )
        state = JobState(row[0])
        if kind is DependencyKind.OK and state in _DEPENDENCY_ENDS:
            raise ValueError(
                f"after: dependency {job_id!r} {_DEPENDENCY_ENDS[state]}, so this job could "
                f"never run (retry {job_id} and depend on the new job)"
            )
        return Dependency(number, kind, state, row[1], row[2])

    def _insert_dependencies(
        self, number: int, dependencies: Sequence[tuple[int, DependencyKind]]
    ) -> None:
        self._db.executemany(
            "INSERT INTO dependencies (job, after, position, kind) VALUES (?, ?, ?, ?)",
            [
                (number, after, position, kind.value)
                for position, (after, kind) in enumerate(dependencies)
            ],
        )

    # --------------------------------------------------------------- reading
    def get(self, job_id: str) -> JobRecord:
        """The job ``job_id`` (``j12``, or an array's member ``j12_3``: its newest run);
        UnknownJobError if the table has none."""
        ref = parse_job_ref("job_id", job_id)
        with self._read():
            return self._get(self._number(ref))

    def members(self, job_id: str) -> builtins.list[str]:
        """The ids ``job_id`` stands for: an array's members (``j12`` -> ``j12_0``,
        ``j12_1``, ...), in index order, when it names an array; else itself (checked:
        UnknownJobError if the table has no such job)."""
        ref = parse_job_ref("job_id", job_id)
        with self._read():
            if ref.member is None:
                rows = self._db.execute(
                    "SELECT DISTINCT array_index FROM jobs WHERE array_of = ? "
                    "ORDER BY array_index", (ref.number,),
                ).fetchall()  # fmt: skip
                if rows:
                    return [f"{ref}_{index}" for (index,) in rows]
            return [self._get(self._number(ref)).id]

    def _number(self, ref: JobRef) -> int:
        """The row ``ref`` names: a job's own number, or an array member's newest run."""
        if ref.member is None:
            return ref.number
        row = self._db.execute(
            "SELECT max(number) FROM jobs WHERE array_of = ? AND array_index = ?",
            (ref.number, ref.member),
        ).fetchone()
        if row[0] is None:
            raise UnknownJobError(
                f"job_id: no job {str(ref)!r} in {str(self.path)!r} (no such array member, or "
                "pruned after its retention)"
            )
        return int(row[0])

    def list(
        self, *, include_finished: bool = False, states: Iterable[str] | None = None
    ) -> list[JobRecord]:
        """The user's jobs, newest first: those not finished (``include_finished``: all,
        as ``hwpool jobs --all``), or those in ``states`` when given."""
        check_bool("include_finished", include_finished)
        if states is not None:
            wanted = [check_state(f"states[{i}]", s) for i, s in enumerate(list(states))]
        elif include_finished:
            wanted = [state.value for state in JobState]
        else:
            wanted = [state.value for state in JobState if not state.finished]
        marks = ", ".join("?" * len(wanted))
        where = f"state IN ({marks})" if wanted else "0"
        with self._read():
            rows = self._db.execute(
                f"SELECT * FROM jobs WHERE {where} ORDER BY number DESC", wanted
            ).fetchall()
            after = self._dependencies_of(f"SELECT number FROM jobs WHERE {where}", wanted)
        return [job_from_row(row, after.get(row["number"], ())) for row in rows]

    def _get(self, number: int) -> JobRecord:
        row = self._db.execute("SELECT * FROM jobs WHERE number = ?", (number,)).fetchone()
        if row is None:
            raise UnknownJobError(
                f"job_id: no job {format_job_id(number)!r} in {str(self.path)!r} (never "
                "submitted, or pruned after its retention)"
            )
        after = self._dependencies_of("SELECT ?", [number])
        return job_from_row(row, after.get(number, ()))

    def _dependencies_of(
        self, jobs: str, parameters: Sequence[Any]
    ) -> dict[int, builtins.list[tuple[str, str]]]:
        """The dependencies of the jobs the query ``jobs`` selects, as ``(id, kind)`` pairs in
        given order."""
        found: dict[int, builtins.list[tuple[str, str]]] = {}
        rows = self._db.execute(
            f"SELECT d.job, d.after, d.kind, j.array_of, j.array_index FROM dependencies d "
            f"LEFT JOIN jobs j ON j.number = d.after WHERE d.job IN ({jobs}) "
            "ORDER BY d.job, d.position",
            parameters,
        )
        for job, after, kind, array_of, array_index in rows:
            found.setdefault(job, []).append((display_id(after, array_of, array_index), kind))
        return found

    # --------------------------------------------------------------- transitions
    def _transition(
        self, job_id: str, action: str, allowed: Iterable[JobState], changes: dict[str, Any]
    ) -> JobRecord:
        """Apply ``changes`` to the job ``job_id`` if it is in one of ``allowed`` states, in
        one transaction; JobStateError (and no change) otherwise."""
        ref = parse_job_ref("job_id", job_id)
        with self._write():
            number = self._number(ref)
            state = self._get(number).state
            if state not in allowed:
                wanted = " or ".join(sorted(s.value for s in allowed))
                raise JobStateError(
                    f"job_id {job_id!r} is {state.value}: {action} needs a job that is {wanted}"
                )
            assignments = ", ".join(f"{key} = :{key}" for key in changes)
            self._db.execute(
                f"UPDATE jobs SET {assignments} WHERE number = :number",
                {**changes, "number": number},
            )
            return self._get(number)

    def mark_running(
        self,
        job_id: str,
        *,
        pid: int,
        pid_start: int,
        gpu_ids: Sequence[str] = (),
        lease: int | None = None,
        stdout_log: str | None = None,
        stderr_log: str | None = None,
        gpu_share: float | None = None,
        now: float | None = None,
    ) -> JobRecord:
        """A queued job was started: its process, its start time, the GPUs it sees, its
        lease and logs, and the GPUs its lease holds (``gpu_share``: 0.5, 2; None unknown)."""
        changes = {
            "state": JobState.RUNNING.value,
            "pid": check_int("pid", pid, minimum=1),
            "pid_start": check_int("pid_start", pid_start, minimum=0, maximum=_MAX_PID_START),
            "gpu_ids": json.dumps(check_gpu_ids(gpu_ids)),
            "lease": check_optional_int("lease", lease, 0, 2**53 - 1),
            "stdout_log": _optional_path("stdout_log", stdout_log),
            "stderr_log": _optional_path("stderr_log", stderr_log),
            "started_at": _now(now),
            "reason": None,  # a note of why it was queued again (note_queued) is past
            "gpu_share": _optional_share(gpu_share),
        }
        return self._transition(job_id, "mark_running", {JobState.QUEUED}, changes)

    def mark_finished(
        self,
        job_id: str,
        *,
        exit_code: int | None = None,
        signal: int | None = None,
        usage: Usage | None = None,
        now: float | None = None,
    ) -> JobRecord:
        """A running job ended by itself: ``succeeded`` for exit code 0, else ``failed``
        (another code, or the ``signal`` that killed it); ``usage``: what it used."""
        code, number = check_exit(exit_code, signal)
        state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
        changes = {"state": state.value, "exit_code": code, "signal": number, "ended_at": _now(now),
                   "ended_by": None, **_usage_columns(usage)}  # fmt: skip
        return self._transition(job_id, "mark_finished", {JobState.RUNNING}, changes)

    def mark_cancelled(
        self,
        job_id: str,
        *,
        reason: str = "cancelled by its user",
        exit_code: int | None = None,
        signal: int | None = None,
        usage: Usage | None = None,
        by: str | None = None,
        now: float | None = None,
    ) -> JobRecord:
        """A queued, waiting or running job was cancelled (a running one after it was
        ended: how it ended, if known, in ``exit_code`` or ``signal``, and what it used);
        ``by``: who cancelled it (a user's name), where the caller knows."""
        if exit_code is None and signal is None:
            code, number = None, None
        else:
            code, number = check_exit(exit_code, signal)
        changes = {
            "state": JobState.CANCELLED.value,
            "reason": check_reason(reason),
            "exit_code": code,
            "signal": number,
            "ended_at": _now(now),
            "held_by": None,  # a hold ends with the job
            **_usage_columns(usage),
        }
        if by is not None:
            changes["ended_by"] = _check_holder(by, "by")
        allowed = {JobState.QUEUED, JobState.WAITING, JobState.RUNNING}
        return self._transition(job_id, "mark_cancelled", allowed, changes)

    def note_cancel(self, job_id: str, by: str) -> JobRecord:
        """Say who is cancelling the running job ``job_id`` before its launcher is told (the
        launcher records the end; one that ends by itself first clears it)."""
        return self._transition(job_id, "note_cancel", {JobState.RUNNING},
                                {"ended_by": _check_holder(by, "by")})  # fmt: skip

    def mark_timed_out(
        self,
        job_id: str,
        *,
        signal: int | None = None,
        usage: Usage | None = None,
        now: float | None = None,
    ) -> JobRecord:
        """A running job was ended for running past its time limit (by ``signal``)."""
        changes = {
            "state": JobState.TIMED_OUT.value,
            "signal": check_optional_int("signal", signal, 1, MAX_SIGNAL),
            "reason": "ran past its time limit",
            "ended_at": _now(now),
            "ended_by": None,
            **_usage_columns(usage),
        }
        return self._transition(job_id, "mark_timed_out", {JobState.RUNNING}, changes)

    def mark_lost(
        self,
        job_id: str,
        *,
        reason: str = "the supervisor found it dead",
        now: float | None = None,
    ) -> JobRecord:
        """A running job died while nothing watched it (its exit status is unknown)."""
        changes = {
            "state": JobState.LOST.value,
            "reason": check_reason(reason),
            "ended_at": _now(now),
        }
        return self._transition(job_id, "mark_lost", {JobState.RUNNING}, changes)

    def note_queued(self, job_id: str, reason: str) -> JobRecord:
        """Say on the queued job ``job_id`` why it is queued again (its launcher died before
        it started the job, say): its reason until it starts (``mark_running`` clears it).
        JobStateError, changing nothing, for a job that is not queued."""
        changes = {"reason": check_reason(reason)}
        return self._transition(job_id, "note_queued", {JobState.QUEUED}, changes)

    def retry(self, job_id: str, *, now: float | None = None) -> JobRecord:
        """Queue a finished job again, as a new job (``retry_of`` names this one) with the
        same command, environment, request and dependencies; the new job."""
        ref = parse_job_ref("job_id", job_id)
        queued_at = _now(now)
        with self._write():
            number = self._number(ref)
            old = self._get(number)
            if not old.state.finished:
                raise JobStateError(
                    f"job_id {job_id!r} is {old.state.value}: retry needs a finished job "
                    "(cancel it first)"
                )
            fields = self._copy_fields(number)
            fields.update(queued_at=queued_at, retry_of=number)
            after = [self._standing_for(job_id, int(a.removeprefix("j"))) for a in old.after]
            others = [(old.after_any, DependencyKind.ANY), (old.after_notok, DependencyKind.NOTOK)]
            kept = {number: DependencyKind.OK for number in after}
            for ids, kind in others:
                for other in ids:
                    kept.setdefault(int(other.removeprefix("j")), kind)
            return self._insert(fields, list(kept.items()))

    def _standing_for(self, job_id: str, number: int) -> int:
        """The dependency a retry of ``job_id`` waits for in place of its dependency
        ``number``: itself while it may still succeed, else its newest retry that may (a retry
        of a retry too). JobStateError naming it, and how it ended, when there is none."""
        found = self._may_succeed(number)
        if found is not None:
            return found
        row = self._db.execute(
            "SELECT state, exit_code, signal FROM jobs WHERE number = ?", (number,)
        ).fetchone()
        dependency = format_job_id(number)
        end = "was pruned" if row is None else _DEPENDENCY_ENDS[JobState(row[0])]
        how = "" if row is None else how_ended(row[1], row[2])
        raise JobStateError(
            f"cannot retry {job_id}: its dependency {dependency} {end}{how} and no retry of it "
            f"may still succeed: retry it first (hwpool retry {dependency}), then retry "
            f"{job_id}, which then waits for that retry"
        )

    def _may_succeed(self, number: int) -> int | None:
        """``number``, or the newest of its retries (followed down), that has not ended
        otherwise than succeeded; None when there is none."""
        row = self._db.execute("SELECT state FROM jobs WHERE number = ?", (number,)).fetchone()
        if row is not None and JobState(row[0]) not in _DEPENDENCY_ENDS:
            return number
        retries = self._db.execute(
            "SELECT number FROM jobs WHERE retry_of = ? ORDER BY number DESC", (number,)
        ).fetchall()
        for (retry,) in retries:
            found = self._may_succeed(retry)
            if found is not None:
                return found
        return None

    def _copy_fields(self, number: int) -> dict[str, Any]:
        columns = ("name", "argv", "cwd", "environment", "gpus", "memory_mib", "priority",
                   "time_limit", "notify", "array_of", "array_index", "array_limit")  # fmt: skip
        row = self._db.execute(
            f"SELECT {', '.join(columns)} FROM jobs WHERE number = ?", (number,)
        ).fetchone()
        return dict(zip(columns, row, strict=True))

    # --------------------------------------------------------------- edits
    def update(
        self,
        job_id: str,
        *,
        name: str | None = None,
        priority: int | None = None,
        time_limit: int | None = None,
        gpus: Fraction | int | float | None = None,
        memory_mib: int | None = None,
    ) -> JobRecord:
        """Change what is given (None: left as it is) of the queued or waiting job
        ``job_id``, in place (same id); ``gpus`` or ``memory_mib`` replaces the request
        whole. Bad values raise TypeError or ValueError, a job in another state
        JobStateError; either changes nothing."""
        changes: dict[str, Any] = {}
        if name is not None:
            changes["name"] = check_name(name, ["-"])
        if priority is not None:
            changes["priority"] = check_priority(priority)
        if time_limit is not None:
            changes["time_limit"] = check_optional_int("time_limit", time_limit, 1, 2**53)
        if gpus is not None or memory_mib is not None:
            share, memory = check_request(gpus, memory_mib)
            changes["gpus"] = None if share is None else str(share)
            changes["memory_mib"] = memory
        if not changes:
            raise ValueError("update: give at least one of name, priority, time_limit, gpus, "
                             "memory_mib")  # fmt: skip
        return self._transition(job_id, "update", _WAITING_OR_QUEUED, changes)

    # --------------------------------------------------------------- notifications
    def to_notify(self) -> builtins.list[JobRecord]:
        """The finished jobs with a notify command not yet started, oldest end first."""
        finished = ", ".join(f"'{state.value}'" for state in FINISHED)
        with self._read():
            rows = self._db.execute(
                f"SELECT * FROM jobs WHERE state IN ({finished}) AND notify IS NOT NULL "
                "AND notified_at IS NULL ORDER BY ended_at, number"
            ).fetchall()
        return [job_from_row(row) for row in rows]

    def mark_notified(self, job_id: str, *, now: float | None = None) -> bool:
        """Record that ``job_id``'s notify command is started; False if it already was (by
        another supervisor: it runs at most once)."""
        ref = parse_job_ref("job_id", job_id)
        with self._write():
            number = self._number(ref)
            cursor = self._db.execute(
                "UPDATE jobs SET notified_at = ? WHERE number = ? AND notified_at IS NULL",
                (_now(now), number),
            )
        return cursor.rowcount == 1

    # --------------------------------------------------------------- holds
    def hold(self, job_id: str, by: str) -> JobRecord:
        """Hold the queued or waiting job ``job_id`` (``by``: who holds it, a user's name):
        it keeps its place but is never started until :meth:`release_hold`. JobStateError,
        changing nothing, for a job in another state (a running job cannot be held)."""
        changes = {"held_by": _check_holder(by)}
        return self._transition(job_id, "hold", _WAITING_OR_QUEUED, changes)

    def release_hold(self, job_id: str) -> JobRecord:
        """Release the hold on ``job_id`` (a job nobody holds is left as it is); JobStateError,
        changing nothing, for a job that is not queued or waiting."""
        return self._transition(job_id, "release", _WAITING_OR_QUEUED, {"held_by": None})

    # --------------------------------------------------------------- dependencies
    def ready(self, *, now: float | None = None) -> builtins.list[JobRecord]:
        """Resolve dependencies, then the queued jobs nobody holds, in submit order (what
        may start).

        A waiting job whose dependencies are met becomes queued (held or not); one with a
        dependency that can never be met (an ``after`` one that failed, was cancelled, timed
        out or was lost; ``after_notok`` ones that all succeeded) is cancelled with the
        reason (``dependency jN failed (exit 1)``, ...), and so are the jobs waiting on it,
        in the same transaction."""
        ended_at = _now(now)
        with self._read():  # most calls have nothing to resolve: no write lock for them
            if not self._has_waiting():
                return self._queued()
        with self._write():
            self._resolve_waiting(ended_at)
            return self._queued()

    def _has_waiting(self) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM jobs WHERE state = ? LIMIT 1", (JobState.WAITING.value,)
        ).fetchone()
        return row is not None

    def _resolve_waiting(self, ended_at: float) -> None:
        """Walk the waiting jobs in id order: a dependency has a smaller id than its
        dependents, so one pass settles every chain."""
        waiting = self._db.execute(
            "SELECT number FROM jobs WHERE state = ? ORDER BY number", (JobState.WAITING.value,)
        ).fetchall()
        for (number,) in waiting:
            rows = self._db.execute(
                "SELECT d.after, d.kind, j.state, j.exit_code, j.signal FROM dependencies d "
                "LEFT JOIN jobs j ON j.number = d.after WHERE d.job = ? ORDER BY d.position",
                (number,),
            ).fetchall()
            found = [
                Dependency(after, DependencyKind(kind), None if state is None else JobState(state),
                           exit_code, signum)
                for after, kind, state, exit_code, signum in rows
            ]  # fmt: skip
            self._settle(number, found, ended_at)

    def _settle(self, number: int, dependencies: Sequence[Dependency], ended_at: float) -> None:
        """Queue or cancel the waiting job ``number`` given its dependencies."""
        outcome = verdict(dependencies)
        if outcome.never is not None:
            self._db.execute(
                "UPDATE jobs SET state = ?, reason = ?, ended_at = ? WHERE number = ?",
                (JobState.CANCELLED.value, outcome.never, ended_at, number),
            )
        elif outcome.ready:
            self._db.execute(
                "UPDATE jobs SET state = ? WHERE number = ?", (JobState.QUEUED.value, number)
            )

    def _queued(self) -> builtins.list[JobRecord]:
        """The queued jobs nobody holds, in submit order."""
        rows = self._db.execute(
            "SELECT * FROM jobs WHERE state = ? AND held_by IS NULL ORDER BY number",
            (JobState.QUEUED.value,),
        ).fetchall()
        query = "SELECT number FROM jobs WHERE state = ? AND held_by IS NULL"
        after = self._dependencies_of(query, [JobState.QUEUED.value])
        return [job_from_row(row, after.get(row["number"], ())) for row in rows]

    # --------------------------------------------------------------- retention
    def prune(
        self,
        now: float,
        keep_seconds: float = DEFAULT_KEEP_SECONDS,
        keep_count: int = DEFAULT_KEEP_COUNT,
    ) -> builtins.list[JobRecord]:
        """Delete the finished jobs that ended more than ``keep_seconds`` before ``now``,
        and those beyond the newest ``keep_count`` finished ones; the jobs deleted (whose
        logs the caller removes). Queued, waiting and running jobs are never deleted, nor a
        finished job that one of them depends on."""
        cutoff = check_time("now", now) - check_time("keep_seconds", keep_seconds)
        keep = check_int("keep_count", keep_count, minimum=0)
        finished = ", ".join(f"'{state.value}'" for state in FINISHED)
        doomed = (
            f"SELECT number FROM jobs WHERE state IN ({finished}) AND (ended_at < :cutoff OR "
            f"number NOT IN (SELECT number FROM jobs WHERE state IN ({finished}) "
            "ORDER BY ended_at DESC, number DESC LIMIT :keep)) AND number NOT IN (SELECT "
            f"d.after FROM dependencies d JOIN jobs j ON j.number = d.job "
            f"WHERE j.state NOT IN ({finished}))"
        )
        parameters = {"cutoff": cutoff, "keep": keep}
        with self._write():
            rows = self._db.execute(f"SELECT * FROM jobs WHERE number IN ({doomed})", parameters)
            gone = [job_from_row(row, ()) for row in rows.fetchall()]
            self._db.executemany(
                "DELETE FROM jobs WHERE number = ?", [(job.number,) for job in gone]
            )
        return gone


_OPTION = {DependencyKind.OK: "after", DependencyKind.ANY: "after_any",
           DependencyKind.NOTOK: "after_notok"}  # fmt: skip


def _kinds(
    after: Iterable[str], after_any: Iterable[str], after_notok: Iterable[str]
) -> builtins.list[tuple[JobRef, DependencyKind]]:
    """The dependencies of every kind, in order (``after``, then ``after_any``, then
    ``after_notok``); ValueError naming both options for a job given in two."""
    found: dict[JobRef, DependencyKind] = {}
    for ids, kind in ((after, DependencyKind.OK), (after_any, DependencyKind.ANY),
                      (after_notok, DependencyKind.NOTOK)):  # fmt: skip
        for ref in check_after(ids, _OPTION[kind]):
            if ref in found:
                raise ValueError(
                    f"{_OPTION[kind]}: {str(ref)!r} is already a dependency "
                    f"({_OPTION[found[ref]]}): give each job once"
                )
            found[ref] = kind
    return list(found.items())


def _check_holder(value: object, name: str = "held_by") -> str | None:
    """Who holds (or cancelled) a job: None, or a user's name (printable, not empty, at most
    64 characters)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a user's name, got {value!r}")
    if not value or len(value) > 64 or not value.isprintable():
        raise ValueError(f"{name} must be a user's name, got {value!r}")
    return value


def _usage_columns(usage: object) -> dict[str, Any]:
    """The table's columns of a job's :class:`Usage` (none when it is None: left unknown)."""
    checked = check_usage(usage)
    return {} if checked is None else checked._asdict()


def _optional_share(value: object) -> float | None:
    """The GPUs a lease holds: None, or a finite number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"gpu_share must be a number of GPUs, got {value!r}")
    if not (math.isfinite(value) and 0 < value <= 2**31):
        raise ValueError(f"gpu_share must be a number of GPUs > 0, got {value!r}")
    return float(value)


def _now(now: float | None) -> float:
    return time.time() if now is None else check_time("now", now)


def _optional_path(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a path, got {value!r}")
    path = os.fspath(value)
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        raise ValueError(f"{name} must be an absolute path, got {path!r}")
    return path
