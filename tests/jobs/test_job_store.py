"""The job table's API on a real sqlite file: every transition, bad inputs, dependencies,
retries and retention."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from jobtables import add, dump

from hostserver import BOUND, ENV
from hwpool._jobs._model import JobRecord, JobState
from hwpool._jobs._schema import read_as_current
from hwpool._jobs._store import (
    SCHEMA_VERSION,
    JobStateError,
    JobStore,
    JobTableError,
    UnknownJobError,
)

T0 = 1_800_000_000.0


def run(store: JobStore, job: JobRecord, **fields: Any) -> JobRecord:
    """``job`` (queued) marked running as a supervisor would."""
    fields.setdefault("pid", 4242)
    fields.setdefault("pid_start", 987654)
    return store.mark_running(job.id, **fields)


def finished(store: JobStore, exit_code: int = 0, **fields: Any) -> JobRecord:
    """A job that ran and exited with ``exit_code``."""
    job = add(store, **fields)
    run(store, job)
    return store.mark_finished(job.id, exit_code=exit_code)


# ----------------------------------------------------------------- adding and reading
def test_add_records_every_field_and_get_reads_it_back(store: JobStore) -> None:
    job = add(
        store, ("python", "train.py", "--lr", "3e-4"), name="lr sweep ü", gpus=0.25,
        priority=5, time_limit=90, now=T0, environment={"TOKEN": "s3cr€t", "EMPTY": ""},
    )  # fmt: skip
    assert job.id == "j1" and job.number == 1
    assert job.state is JobState.QUEUED
    assert job.argv == ("python", "train.py", "--lr", "3e-4")
    assert (job.name, job.cwd, job.priority, job.time_limit) == ("lr sweep ü", "/srv/work", 5, 90)
    assert job.environment == {"TOKEN": "s3cr€t", "EMPTY": ""}
    assert (job.gpus, job.memory_mib, job.queued_at) == (Fraction(1, 4), None, T0)
    assert job.started_at is job.ended_at is job.exit_code is job.pid is None
    assert store.get("j1") == job


def test_ids_are_prefixed_and_follow_submit_order(store: JobStore) -> None:
    assert [add(store).id for _ in range(3)] == ["j1", "j2", "j3"]


@pytest.mark.parametrize(
    ("request_", "gpus", "memory"),
    [
        ({}, Fraction(1), None),
        ({"gpus": 1}, Fraction(1), None),
        ({"gpus": Fraction(1, 3)}, Fraction(1, 3), None),
        ({"gpus": 0.1}, Fraction(1, 10), None),
        ({"gpus": 3}, 3, None),
        ({"gpus": 2.0}, 2, None),
        ({"memory_mib": 20_000}, None, 20_000),
    ],
)
def test_the_request_is_kept_exactly(
    store: JobStore, request_: dict[str, Any], gpus: object, memory: object
) -> None:
    job = add(store, **request_)
    assert (job.gpus, job.memory_mib) == (gpus, memory)
    assert (store.get(job.id).gpus, store.get(job.id).memory_mib) == (gpus, memory)


def test_a_job_is_named_after_its_command_by_default(store: JobStore) -> None:
    assert add(store, ("/usr/bin/python3", "x.py")).name == "python3"


BAD_ADDS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"argv": ()}, ValueError, "argv must not be empty"),
    ({"argv": "python train.py"}, TypeError, "argv must be a list of strings"),
    ({"argv": ("python", 3)}, TypeError, "argv[1] must be a string, got 3"),
    ({"argv": ("",)}, ValueError, "argv[0] (the command) must not be empty"),
    ({"argv": ("a\0b",)}, ValueError, "argv[0] must not contain a NUL"),
    ({"cwd": "work"}, ValueError, "cwd must be an absolute path, got 'work'"),
    ({"environment": {"A": 1}}, TypeError, "environment['A'] must map a string"),
    ({"environment": {"A=B": "1"}}, ValueError, "environment['A=B']"),
    ({"name": ""}, ValueError, "name must be 1 to 256 characters"),
    ({"gpus": 0}, ValueError, "gpus must be a fraction in (0, 1] or an int >= 2, got 0"),
    ({"gpus": 1.5}, ValueError, "got 1.5"),
    ({"gpus": float("nan")}, ValueError, "got nan"),
    ({"gpus": "1"}, TypeError, "gpus must be a number, got '1'"),
    ({"gpus": 1, "memory_mib": 100}, ValueError, "give gpus or memory_mib, not both"),
    ({"memory_mib": 0}, ValueError, "memory_mib must be >= 1, got 0"),
    ({"priority": 1001}, ValueError, "priority must be between -1000 and 1000, got 1001"),
    ({"priority": True}, TypeError, "priority must be an int, got True"),
    ({"time_limit": 0}, ValueError, "time_limit must be between 1 and"),
    ({"after": ["3"]}, ValueError, "after[0] must be a job id such as 'j12', got '3' (a bare"),
    ({"after": ["j0"]}, ValueError, "after[0] must be a job id such as 'j12', got 'j0'"),
    ({"after": ["j01"]}, ValueError, "got 'j01'"),
    ({"after": [1]}, TypeError, "after[0] must be a job id such as 'j12', got 1"),
    ({"after": "j1"}, TypeError, "after must be a list of job ids, got the string 'j1'"),
    ({"after": ["j9"]}, ValueError, "after: no job 'j9' in your job table"),
    ({"now": -1}, ValueError, "now must be a finite time >= 0, got -1"),
]


@pytest.mark.parametrize(("fields", "error", "message"), BAD_ADDS)
def test_bad_input_names_the_argument_and_value_and_adds_nothing(
    store: JobStore, fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    add(store)
    before = dump(store.path)
    argv = fields.pop("argv", ("python", "train.py"))
    with pytest.raises(error) as raised:
        add(store, argv, **fields)
    assert message in str(raised.value)
    assert dump(store.path) == before
    assert add(store).id == "j2"  # no id was spent either


def test_listing_is_newest_first_and_hides_finished_jobs_unless_asked(store: JobStore) -> None:
    done = finished(store)
    running = run(store, add(store))
    queued = add(store)
    assert [job.id for job in store.list()] == [queued.id, running.id]
    assert [job.id for job in store.list(include_finished=True)] == [queued.id, running.id, done.id]
    assert [job.id for job in store.list(states=["succeeded", "queued"])] == [queued.id, done.id]
    assert store.list(states=[]) == []


def test_listing_takes_a_bool_for_include_finished(store: JobStore) -> None:
    with pytest.raises(TypeError, match="include_finished must be a bool, got 1"):
        store.list(include_finished=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("states", "error", "message"),
    [
        (["done"], ValueError, "states[0] must be a job state (queued, waiting-on-dependency"),
        (["queued", 3], TypeError, "states[1] must be a job state (a string), got 3"),
    ],
)
def test_listing_an_unknown_state_is_refused(
    store: JobStore, states: list[Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        store.list(states=states)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("job_id", "error", "message"),
    [
        ("j99", UnknownJobError, "job_id: no job 'j99' in"),
        ("12", ValueError, "job_id must be a job id such as 'j12', got '12' (a bare number is a"),
        ("J1", ValueError, "got 'J1'"),
        (1, TypeError, "job_id must be a job id such as 'j12', got 1"),
    ],
)
def test_a_bad_or_unknown_id_is_refused(
    store: JobStore, job_id: Any, error: type[Exception], message: str
) -> None:
    add(store)
    before = dump(store.path)
    for action in (store.get, store.mark_lost, store.retry):
        with pytest.raises(error) as raised:
            action(job_id)
        assert message in str(raised.value)
    assert dump(store.path) == before


# ----------------------------------------------------------------- transitions
def test_running_records_the_process_gpus_lease_and_logs(store: JobStore) -> None:
    job = run(
        store, add(store), pid=31337, pid_start=123456, gpu_ids=["GPU-aa", "GPU-bb"], lease=17,
        stdout_log="/state/logs/j1.out", stderr_log="/state/logs/j1.err", now=T0 + 5,
    )  # fmt: skip
    assert job.state is JobState.RUNNING
    assert (job.pid, job.pid_start, job.lease) == (31337, 123456, 17)
    assert job.gpu_ids == ("GPU-aa", "GPU-bb")
    assert (job.stdout_log, job.stderr_log, job.started_at) == (
        "/state/logs/j1.out", "/state/logs/j1.err", T0 + 5,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("end", "state", "code", "signal"),
    [
        ({"exit_code": 0}, JobState.SUCCEEDED, 0, None),
        ({"exit_code": 3}, JobState.FAILED, 3, None),
        ({"signal": 9}, JobState.FAILED, None, 9),
    ],
)
def test_a_job_that_ends_by_itself_succeeds_or_fails(
    store: JobStore, end: dict[str, int], state: JobState, code: int | None, signal: int | None
) -> None:
    job = run(store, add(store))
    done = store.mark_finished(job.id, now=T0 + 9, **end)
    assert (done.state, done.exit_code, done.signal, done.ended_at) == (state, code, signal, T0 + 9)
    assert done.pid == 4242  # what was known stays


def test_cancelling_works_from_queued_waiting_and_running(store: JobStore) -> None:
    first = add(store)
    waiting = add(store, after=[first.id])
    running = run(store, add(store))
    assert waiting.state is JobState.WAITING
    for job in (waiting, first):
        assert store.mark_cancelled(job.id, now=T0).state is JobState.CANCELLED
    ended = store.mark_cancelled(running.id, reason="cancelled by alice", signal=15)
    assert (ended.state, ended.reason, ended.signal) == (
        JobState.CANCELLED,
        "cancelled by alice",
        15,
    )
    assert store.get(first.id).reason == "cancelled by its user"


def test_a_running_job_can_time_out_or_be_lost(store: JobStore) -> None:
    late = run(store, add(store, time_limit=1))
    timed_out = store.mark_timed_out(late.id, signal=9, now=T0)
    assert (timed_out.state, timed_out.signal) == (JobState.TIMED_OUT, 9)
    assert timed_out.reason == "ran past its time limit"
    gone = run(store, add(store))
    lost = store.mark_lost(gone.id, reason="pid 4242 is another process now")
    assert (lost.state, lost.reason) == (JobState.LOST, "pid 4242 is another process now")


TRANSITIONS: dict[str, tuple[Callable[[JobStore, str], JobRecord], set[JobState]]] = {
    "mark_running": (lambda s, j: run(s, s.get(j)), {JobState.QUEUED}),
    "mark_finished": (lambda s, j: s.mark_finished(j, exit_code=0), {JobState.RUNNING}),
    "mark_cancelled": (
        lambda s, j: s.mark_cancelled(j),
        {JobState.QUEUED, JobState.WAITING, JobState.RUNNING},
    ),
    "mark_timed_out": (lambda s, j: s.mark_timed_out(j), {JobState.RUNNING}),
    "mark_lost": (lambda s, j: s.mark_lost(j), {JobState.RUNNING}),
    "retry": (
        lambda s, j: s.retry(j),
        set(JobState) - {JobState.QUEUED, JobState.WAITING, JobState.RUNNING},
    ),
}


def a_job_in(store: JobStore, state: JobState) -> JobRecord:
    """A job brought into ``state`` through the API."""
    if state is JobState.WAITING:
        return add(store, after=[add(store).id])
    job = add(store)
    if state is JobState.QUEUED:
        return job
    if state is JobState.CANCELLED:
        return store.mark_cancelled(job.id)
    job = run(store, job)
    ends: dict[JobState, Callable[[], JobRecord]] = {
        JobState.RUNNING: lambda: job,
        JobState.SUCCEEDED: lambda: store.mark_finished(job.id, exit_code=0),
        JobState.FAILED: lambda: store.mark_finished(job.id, exit_code=1),
        JobState.TIMED_OUT: lambda: store.mark_timed_out(job.id),
        JobState.LOST: lambda: store.mark_lost(job.id),
    }
    return ends[state]()


@pytest.mark.parametrize("state", list(JobState), ids=str)
@pytest.mark.parametrize("action", list(TRANSITIONS))
def test_a_transition_from_the_wrong_state_is_refused_and_changes_nothing(
    store: JobStore, action: str, state: JobState
) -> None:
    transition, allowed = TRANSITIONS[action]
    job = a_job_in(store, state)
    assert job.state is state
    if state in allowed:
        transition(store, job.id)
        return
    before = dump(store.path)
    with pytest.raises(JobStateError) as raised:
        transition(store, job.id)
    assert f"job_id {job.id!r} is {state.value}: {action} needs a job that is" in str(
        raised.value
    ) or f"job_id {job.id!r} is {state.value}: retry needs a finished job" in str(raised.value)
    assert dump(store.path) == before


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s, j: s.mark_finished(j), "give exit_code or signal, exactly one"),
        (lambda s, j: s.mark_finished(j, exit_code=0, signal=9), "exactly one"),
        (lambda s, j: s.mark_finished(j, exit_code=256), "exit_code must be between 0 and 255"),
        (lambda s, j: s.mark_finished(j, signal=0), "signal must be between 1 and"),
        (lambda s, j: s.mark_cancelled(j, reason=""), "reason must be 1 to 1000 characters"),
        (lambda s, j: s.mark_lost(j, now=float("inf")), "now must be a finite time >= 0"),
    ],
)
def test_bad_values_of_a_transition_change_nothing(
    store: JobStore, call: Callable[[JobStore, str], JobRecord], message: str
) -> None:
    job = run(store, add(store))
    before = dump(store.path)
    with pytest.raises(ValueError) as raised:
        call(store, job.id)
    assert message in str(raised.value)
    assert dump(store.path) == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pid": 0}, "pid must be >= 1, got 0"),
        ({"pid_start": -1}, "pid_start must be between 0 and"),
        ({"gpu_ids": "GPU-aa"}, "gpu_ids must be a list of strings"),
        ({"gpu_ids": ["GPU-a,GPU-b"]}, "gpu_ids[0] must be a GPU's id (no comma)"),
        ({"stdout_log": "j1.out"}, "stdout_log must be an absolute path, got 'j1.out'"),
        ({"lease": -1}, "lease must be between 0 and"),
    ],
)
def test_bad_values_of_mark_running_change_nothing(
    store: JobStore, fields: dict[str, Any], message: str
) -> None:
    job = add(store)
    before = dump(store.path)
    with pytest.raises((TypeError, ValueError)) as raised:
        run(store, job, **fields)
    assert message in str(raised.value)
    assert dump(store.path) == before


# ----------------------------------------------------------------- dependencies
def test_a_job_waits_until_its_dependencies_succeed(store: JobStore) -> None:
    first, second = add(store), add(store)
    after = add(store, after=[first.id, second.id, first.id])
    assert after.after == (first.id, second.id)  # each once, in the order given
    assert [job.id for job in store.ready()] == [first.id, second.id]
    run(store, first)
    store.mark_finished(first.id, exit_code=0)
    assert store.get(after.id).state is JobState.WAITING
    assert [job.id for job in store.ready()] == [second.id]  # still waits for the second
    run(store, second)
    store.mark_finished(second.id, exit_code=0)
    assert [job.id for job in store.ready()] == [after.id]
    assert store.get(after.id).state is JobState.QUEUED


def test_a_dependency_that_already_succeeded_queues_the_job_at_once(store: JobStore) -> None:
    done = finished(store)
    assert add(store, after=[done.id]).state is JobState.QUEUED


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        (lambda s, j: s.mark_finished(j, exit_code=1), "dependency j1 failed (exit 1)"),
        (lambda s, j: s.mark_timed_out(j), "dependency j1 timed out"),
        (lambda s, j: s.mark_lost(j), "dependency j1 was lost"),
        (lambda s, j: s.mark_cancelled(j), "dependency j1 was cancelled"),
    ],
)
def test_when_a_dependency_does_not_succeed_the_chain_is_cancelled_with_the_reason(
    store: JobStore, end: Callable[[JobStore, str], JobRecord], reason: str
) -> None:
    first = run(store, add(store))
    second = add(store, after=[first.id])
    third = add(store, after=[second.id])
    other = add(store)
    end(store, first.id)
    assert [job.id for job in store.ready(now=T0)] == [other.id]
    cancelled = store.get(second.id), store.get(third.id)
    assert [job.state for job in cancelled] == [JobState.CANCELLED] * 2
    assert [job.reason for job in cancelled] == [reason, "dependency j2 was cancelled"]
    assert [job.ended_at for job in cancelled] == [T0, T0]


def test_a_dependency_that_can_no_longer_succeed_is_refused_at_add(store: JobStore) -> None:
    failed = finished(store, exit_code=2)
    before = dump(store.path)
    with pytest.raises(ValueError, match=r"after: dependency 'j1' failed, so this job could never"):
        add(store, after=[failed.id])
    assert dump(store.path) == before


def test_no_cycle_can_form_a_job_may_only_depend_on_existing_ones(store: JobStore) -> None:
    with pytest.raises(ValueError, match="after: no job 'j1' in your job table"):
        add(store, after=["j1"])  # itself: the job would have been j1
    add(store)
    with pytest.raises(ValueError, match="after: no job 'j3'"):
        add(store, after=["j3"])  # a later job


def test_another_tables_ids_are_unknown_here(store: JobStore, tmp_path: Path) -> None:
    with JobStore.open(tmp_path / "someone-else") as theirs:
        for _ in range(3):
            add(theirs)
    add(store)
    with pytest.raises(ValueError, match="after: no job 'j3' in your job table"):
        add(store, after=["j3"])


# ----------------------------------------------------------------- retries
def test_a_retry_is_a_new_job_and_the_old_run_is_kept(store: JobStore) -> None:
    base = finished(store)
    failed = finished(store, exit_code=3, after=[base.id], gpus=0.5, priority=2, time_limit=60)
    again = store.retry(failed.id, now=T0)
    assert (again.id, again.retry_of, again.state) == ("j3", failed.id, JobState.QUEUED)
    assert (again.argv, again.environment, again.gpus, again.after) == (
        failed.argv, failed.environment, failed.gpus, failed.after,
    )  # fmt: skip
    assert (again.priority, again.time_limit, again.queued_at) == (2, 60, T0)
    assert again.exit_code is again.pid is again.started_at is None
    assert store.get(failed.id) == failed


def test_a_retry_waits_for_unfinished_dependencies(store: JobStore) -> None:
    first = add(store)
    waiting = add(store, after=[first.id])
    store.mark_cancelled(waiting.id)
    assert store.retry(waiting.id).state is JobState.WAITING


# ----------------------------------------------------------------- retention
def test_prune_deletes_old_finished_jobs_and_never_unfinished_ones(store: JobStore) -> None:
    old = add(store)
    run(store, old)
    store.mark_finished(old.id, exit_code=0, now=T0)
    old_cancelled = store.mark_cancelled(add(store).id, now=T0)
    recent = run(store, add(store))
    store.mark_finished(recent.id, exit_code=1, now=T0 + 8 * 86400)
    running = run(store, add(store, now=T0), now=T0)
    queued = add(store, now=T0)
    gone = store.prune(now=T0 + 8 * 86400)
    assert sorted(job.id for job in gone) == [old.id, old_cancelled.id]
    left = [job.id for job in store.list(include_finished=True)]
    assert left == [queued.id, running.id, recent.id]
    assert add(store).id == "j6"  # ids are never reused


def test_prune_keeps_the_newest_finished_jobs_up_to_keep_count(store: JobStore) -> None:
    done = []
    for second in range(5):
        job = run(store, add(store))
        done.append(store.mark_finished(job.id, exit_code=0, now=T0 + second))
    gone = store.prune(now=T0 + 10, keep_count=2)
    assert sorted(job.id for job in gone) == ["j1", "j2", "j3"]
    assert [job.id for job in store.list(include_finished=True)] == ["j5", "j4"]


def test_prune_keeps_a_finished_job_that_a_waiting_one_depends_on(store: JobStore) -> None:
    first = run(store, add(store))
    waiting = add(store, after=[first.id])
    store.mark_finished(first.id, exit_code=0, now=T0)
    assert store.prune(now=T0 + 30 * 86400) == []  # ready() has not run yet
    assert [job.id for job in store.ready()] == [waiting.id]


def test_a_pruned_dependency_leaves_its_dependents_record_intact(store: JobStore) -> None:
    first = finished(store)
    second = finished(store, after=[first.id])
    store.prune(now=time.time(), keep_count=1)
    assert store.get(second.id).after == (first.id,)
    with pytest.raises(UnknownJobError):
        store.get(first.id)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"keep_count": -1}, "keep_count must be >= 0, got -1"),
        ({"keep_seconds": float("nan")}, "keep_seconds must be a finite time >= 0"),
        ({"now": "today"}, "now must be a time in seconds, got 'today'"),
    ],
)
def test_bad_retention_is_refused(store: JobStore, fields: dict[str, Any], message: str) -> None:
    finished(store)
    before = dump(store.path)
    arguments: dict[str, Any] = {"now": T0, **fields}
    with pytest.raises((TypeError, ValueError)) as raised:
        store.prune(**arguments)
    assert message in str(raised.value)
    assert dump(store.path) == before


# ----------------------------------------------------------------- the file
def test_the_table_is_in_wal_mode_with_a_versioned_schema(store: JobStore) -> None:
    connection = sqlite3.connect(store.path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        connection.close()


def test_reopening_keeps_every_job(state_dir: Path) -> None:
    with JobStore.open(state_dir) as store:
        job = add(store, gpus=3)
    with JobStore.open(state_dir) as store:
        assert store.get(job.id) == job


def test_a_table_from_a_newer_hwpool_is_refused(state_dir: Path) -> None:
    JobStore.open(state_dir).close()
    connection = sqlite3.connect(state_dir / "jobs.db")
    connection.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    connection.close()
    newer = rf"was made by a newer hwpool \(schema {SCHEMA_VERSION + 1}; this one"
    with pytest.raises(JobTableError, match=newer):
        JobStore.open(state_dir)


_STATES_1 = (
    "'queued', 'waiting-on-dependency', 'running', 'succeeded', 'failed', 'cancelled', "
    "'timed-out', 'lost'"
)
_SCHEMA_1 = f"""
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
    state       TEXT NOT NULL CHECK (state IN ({_STATES_1})),
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
    CHECK ((gpus IS NULL) <> (memory_mib IS NULL))
);
CREATE TABLE dependencies (
    job      INTEGER NOT NULL REFERENCES jobs (number) ON DELETE CASCADE,
    after    INTEGER NOT NULL,  -- no foreign key: a record outlives its pruned dependency
    position INTEGER NOT NULL,
    PRIMARY KEY (job, after)
) WITHOUT ROWID;
CREATE INDEX jobs_by_state ON jobs (state, number);
CREATE INDEX dependencies_by_after ON dependencies (after);
"""
"""The table as hwpool made it at schema 1 (before holds and dependency kinds), verbatim."""


def _table_of_schema_1(state_dir: Path) -> Path:
    """A table as hwpool 0.1 left it: j1, and j2 after j1."""
    state_dir.mkdir(mode=0o700)
    connection = sqlite3.connect(state_dir / "jobs.db", isolation_level=None)
    for statement in _SCHEMA_1.split(";\n"):
        if statement.strip():
            connection.execute(statement)
    connection.execute("PRAGMA user_version=1")
    row = ("train", '["python"]', "/srv", "{}", "1/2", 0, "queued", 1.0)
    for _ in range(2):
        connection.execute(
            "INSERT INTO jobs (name, argv, cwd, environment, gpus, priority, state, queued_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row,
        )  # fmt: skip
    connection.execute("INSERT INTO dependencies (job, after, position) VALUES (2, 1, 0)")
    connection.close()
    os.chmod(state_dir / "jobs.db", 0o600)
    return state_dir / "jobs.db"


def test_a_table_of_schema_1_is_read_read_only_as_it_is(state_dir: Path) -> None:
    """Root's ``jobs --all-users`` reads a user's table its owner has not opened since the
    upgrade: through temporary views, writing nothing."""
    path = _table_of_schema_1(state_dir)
    before = dump(path)
    connection = sqlite3.connect(f"file:{path}?immutable=1", uri=True, isolation_level=None)
    connection.row_factory = sqlite3.Row
    try:
        read_as_current(connection, path)
        jobs = JobStore(connection, path).list(include_finished=True)
    finally:
        connection.close()
    assert [(job.id, job.after, job.held_by) for job in jobs] == [("j2", ("j1",), None),
                                                                   ("j1", (), None)]  # fmt: skip
    assert dump(path) == before


def test_a_table_of_schema_1_is_brought_up_to_date_keeping_every_job(state_dir: Path) -> None:
    _table_of_schema_1(state_dir)
    with JobStore.open(state_dir) as store:
        second = store.get("j2")
        assert (second.after, second.after_any, second.held_by) == (("j1",), (), None)
        third = store.add(["true"], cwd="/srv", environment={}, after_any=["j2"])
        assert third.after_any == ("j2",) and third.state is JobState.WAITING
        assert store.hold("j1", "alice").held_by == "alice"
    connection = sqlite3.connect(state_dir / "jobs.db")
    try:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a database at all, just text" * 100, "cannot be used: file is not a database"),
        (None, "is a database but not hwpool's job table"),
    ],
)
def test_a_file_that_is_not_a_job_table_is_refused(
    state_dir: Path, content: bytes | None, message: str
) -> None:
    state_dir.mkdir(mode=0o700)
    path = state_dir / "jobs.db"
    if content is None:
        connection = sqlite3.connect(path)
        connection.execute("CREATE TABLE notes (text TEXT)")
        connection.close()
    else:
        path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(JobTableError, match=message):
        JobStore.open(state_dir)


WRITE_AND_CLOSE = """
import sys
from pathlib import Path
from hwpool._jobs._store import JobStore
with JobStore.open(Path(sys.argv[1])) as store:
    store.add(["true"], cwd="/", environment={})
"""


def test_opening_the_table_again_keeps_the_locks_of_the_open_connections(
    store: JobStore, state_dir: Path
) -> None:
    # Closing any descriptor of a file drops all of the process's POSIX locks on it, sqlite's
    # too: a second open in this process once let another process that closed its own
    # connection think it was the last one, checkpoint the table and remove its write-ahead
    # log under the first connection ("database disk image is malformed").
    add(store)
    JobStore.open(state_dir).close()
    done = subprocess.run(
        [sys.executable, "-c", WRITE_AND_CLOSE, str(state_dir)],
        capture_output=True, text=True, env=ENV, timeout=BOUND * 3, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (state_dir / "jobs.db-wal").exists()  # this process still has it open
    assert [job.id for job in store.list()] == ["j2", "j1"]
