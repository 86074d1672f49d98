"""The job table across processes: a writer killed (SIGKILL) in the middle of its writes
leaves it consistent, and readers go on while another process writes (WAL)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobtables import add, dump

from hostserver import BOUND, ENV, _readline
from hwpool._jobs._model import JobState
from hwpool._jobs._store import JobStore

WRITER = str(Path(__file__).with_name("jobwriter.py"))


@contextmanager
def writer(directory: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A jobwriter.py process (see it), always ended."""
    proc = subprocess.Popen(
        [sys.executable, WRITER, str(directory), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=BOUND)


def killed(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` and wait for it."""
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(BOUND) == -signal.SIGKILL


def check_consistent(path: Path) -> None:
    """The table passes sqlite's own check and the job table's rules (see jobwriter.py)."""
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
        rows = connection.execute(
            "SELECT j.name, count(d.after) FROM jobs j LEFT JOIN dependencies d "
            "ON d.job = j.number GROUP BY j.number"
        ).fetchall()
    finally:
        connection.close()
    assert all(name == f"deps{count}" for name, count in rows), rows
    with JobStore.open(path.parent) as store:
        for job in store.list(include_finished=True):
            if job.state is not JobState.QUEUED and job.state is not JobState.WAITING:
                assert job.ended_at is not None or job.state is JobState.RUNNING
            if job.state in (JobState.SUCCEEDED, JobState.FAILED):
                assert job.pid is not None and job.started_at is not None
                assert (job.exit_code == 0) == (job.state is JobState.SUCCEEDED)
            if job.retry_of is not None:
                assert job.argv == ("step",)
        store.ready()
        add(store, name="deps0")  # and it takes new work


def test_a_writer_killed_inside_a_transaction_leaves_nothing_of_it(state_dir: Path) -> None:
    with JobStore.open(state_dir) as store:
        first, second = add(store, name="deps0"), add(store, name="deps0")
    before = dump(state_dir / "jobs.db")
    with writer(state_dir, "stall") as proc:
        assert _readline(proc, BOUND) == "inside"  # the job and its dependencies are written
        killed(proc)
    assert dump(state_dir / "jobs.db") == before
    with JobStore.open(state_dir) as store:
        assert [job.id for job in store.list()] == [second.id, first.id]
        assert add(store, name="deps0").id == "j3"  # the killed add's id was never given
    check_consistent(state_dir / "jobs.db")


def test_a_writer_killed_anywhere_in_a_stream_of_writes_leaves_a_consistent_table(
    state_dir: Path,
) -> None:
    with writer(state_dir, "stream") as proc:
        while int(_readline(proc, BOUND)) < 300:
            pass
        killed(proc)
    check_consistent(state_dir / "jobs.db")


def test_a_reader_in_a_transaction_does_not_stop_a_writer(state_dir: Path) -> None:
    with JobStore.open(state_dir) as store:
        add(store)
    reader = sqlite3.connect(state_dir / "jobs.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
        with writer(state_dir, "add", "20") as proc:
            assert proc.wait(BOUND) == 0, proc.stderr.read() if proc.stderr else ""
        assert reader.execute("SELECT count(*) FROM jobs").fetchone() == (1,)  # its snapshot
        reader.execute("COMMIT")
        assert reader.execute("SELECT count(*) FROM jobs").fetchone() == (21,)
    finally:
        reader.close()


def test_listing_goes_on_while_another_process_writes(state_dir: Path) -> None:
    JobStore.open(state_dir).close()
    seen: list[int] = []
    with JobStore.open(state_dir) as store, writer(state_dir, "add", "300") as proc:
        deadline = time.monotonic() + BOUND * 6
        while proc.poll() is None and time.monotonic() < deadline:
            jobs = store.list()
            assert [job.number for job in jobs] == list(range(len(jobs), 0, -1))
            seen.append(len(jobs))
        assert proc.wait(BOUND) == 0
        assert len(store.list()) == 300
    assert seen == sorted(seen)
