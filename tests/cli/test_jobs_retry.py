"""``hwpool retry`` of a job cancelled because a dependency did not succeed, and what
``hwpool jobs`` and ``wait`` say about why a job was cancelled: real ``python -m hwpool``
processes on a real job table (``HWPOOL_STATE_DIR`` set to the test's)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hwpool._jobs._store import JobStore
from jobprocs import hwpool, kill_supervisor

ENV = {"PATH": "/usr/bin"}


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The test's state directory; the supervisor that a retry starts there is killed after."""
    yield tmp_path / "state"
    kill_supervisor(tmp_path / "state")


@pytest.fixture
def store(state_dir: Path) -> Iterator[JobStore]:
    with JobStore.open(state_dir) as opened:
        yield opened


def add(store: JobStore, after: list[str] | None = None) -> str:
    return store.add(["python", "train.py"], cwd="/srv", environment=ENV, after=after or ()).id


def fail(store: JobStore, job_id: str, **how: int) -> None:
    """Run ``job_id`` and end it failed (``exit_code=1``, or ``signal=9``)."""
    store.mark_running(job_id, pid=4242, pid_start=1)
    store.mark_finished(job_id, **(how or {"exit_code": 1}))
    store.ready()  # as the supervisor does: the jobs after it are cancelled


def listed(state_dir: Path) -> dict[str, dict[str, Any]]:
    proc = hwpool(state_dir, "jobs", "--all", "--json")
    assert proc.returncode == 0, proc.stderr
    return {job["id"]: job for job in json.loads(proc.stdout)}


def dump(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        return "\n".join(connection.iterdump())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("how", "shown"), [({"exit_code": 1}, "exit 1"), ({"signal": 9}, "SIGKILL")]
)
def test_jobs_and_wait_say_which_dependency_failed_and_how(
    store: JobStore, state_dir: Path, how: dict[str, int], shown: str
) -> None:
    first = add(store)
    second = add(store, after=[first])
    fail(store, first, **how)
    why = f"dependency {first} failed ({shown})"
    assert listed(state_dir)[second]["reason"] == why
    table = hwpool(state_dir, "jobs").stdout
    assert why in table
    waited = hwpool(state_dir, "wait", second)
    assert f"{second}: cancelled: {why}" in waited.stdout, waited.stdout


def test_retry_of_a_job_whose_dependency_failed_says_which_and_changes_nothing(
    store: JobStore, state_dir: Path
) -> None:
    first = add(store)
    second = add(store, after=[first])
    fail(store, first)
    before = dump(store.path)
    proc = hwpool(state_dir, "retry", second)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwpool: error: "), proc.stderr
    assert f"dependency {first} failed (exit 1)" in lines[0]
    assert f"hwpool retry {first}" in lines[0]
    assert dump(store.path) == before


def test_retry_of_a_job_whose_dependency_failed_waits_for_that_dependencys_retry(
    store: JobStore, state_dir: Path
) -> None:
    first = add(store)
    second = add(store, after=[first])
    fail(store, first)
    again = hwpool(state_dir, "retry", first)
    assert again.returncode == 0, again.stderr
    first_again = again.stdout.split(":")[0]
    proc = hwpool(state_dir, "retry", second)
    assert proc.returncode == 0, proc.stderr
    second_again = proc.stdout.split(":")[0]
    jobs = listed(state_dir)
    assert jobs[second_again]["after"] == [first_again]
    assert jobs[second_again]["retry_of"] == second
    assert jobs[second_again]["state"] == "waiting-on-dependency"
