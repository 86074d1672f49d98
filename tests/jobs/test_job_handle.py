"""``hwpool.Job``, the handle on one job, and the logic it shares with the commands
(``_control``: exit statuses, waiting, cancelling; ``_logs``: reading a log safely), on a
real table, with the stand-in launcher as the running job's process."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobtables import add, dump

import hwpool
from hostserver import BOUND
from hwpool._jobs._control import exit_status, record_if_dead, wait_for
from hwpool._jobs._model import JobRecord, JobState
from hwpool._jobs._store import JobStateError, JobStore, UnknownJobError
from hwpool._wire._safety import UnsafePathError
from jobprocs import NO_SERVER, Standin, kill_supervisor


@pytest.fixture(autouse=True)
def no_server(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No server for a supervisor that ``retry`` starts; killed after the test."""
    for name, value in NO_SERVER.items():
        monkeypatch.setenv(name, value)
    yield
    kill_supervisor(state_dir)


@pytest.fixture
def standins() -> Iterator[list[Standin]]:
    """Stand-in launchers started by the test, killed after it."""
    started: list[Standin] = []
    yield started
    for standin in started:
        standin.kill()


def ended(store: JobStore, how: str) -> JobRecord:
    """A job that ran and ended ``how`` (or was cancelled before it ran)."""
    job = add(store)
    if how == "cancelled-queued":
        return store.mark_cancelled(job.id)
    store.mark_running(job.id, pid=4242, pid_start=1)
    outcomes = {
        "succeeded": lambda: store.mark_finished(job.id, exit_code=0),
        "exit 3": lambda: store.mark_finished(job.id, exit_code=3),
        "killed": lambda: store.mark_finished(job.id, signal=9),
        "timed-out": lambda: store.mark_timed_out(job.id, signal=15),
        "lost": lambda: store.mark_lost(job.id),
        "cancelled-running": lambda: store.mark_cancelled(job.id, signal=15),
        "cancelled-killed": lambda: store.mark_cancelled(job.id, signal=9),
        "cancelled-exited": lambda: store.mark_cancelled(job.id, exit_code=0),
    }
    return outcomes[how]()


@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("succeeded", 0), ("exit 3", 3), ("killed", 137), ("timed-out", 124), ("lost", 123),
        ("cancelled-running", 143), ("cancelled-killed", 137), ("cancelled-exited", 143),
        ("cancelled-queued", 143),
    ],
)  # fmt: skip
def test_each_end_has_its_exit_status(store: JobStore, how: str, status: int) -> None:
    assert exit_status(ended(store, how)) == status


def test_an_unfinished_job_has_no_exit_status(store: JobStore) -> None:
    with pytest.raises(ValueError, match=r"j1 has not finished \(queued\)"):
        exit_status(add(store))


# ----------------------------------------------------------------- the handle
def test_the_handle_reads_the_table_afresh(store: JobStore, state_dir: Path) -> None:
    job = hwpool.Job(add(store).id, state_dir=state_dir)
    assert (job.id, job.state, job.exit_code) == ("j1", JobState.QUEUED, None)
    store.mark_running("j1", pid=4242, pid_start=1)
    store.mark_finished("j1", exit_code=3)
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    assert job.record().exit_code == 3
    assert repr(job) == f"Job('j1', state_dir={str(state_dir)!r})"
    assert job == hwpool.Job("j1", state_dir=state_dir) and job != hwpool.Job("j2")


def test_the_default_state_directory_is_the_users(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWPOOL_STATE_DIR", str(state_dir))
    assert hwpool.Job("j4").state_dir == state_dir


@pytest.mark.parametrize(
    ("value", "error", "fragment"),
    [
        ("j0", ValueError, "job_id must be a job id such as 'j12', got 'j0'"),
        ("j01", ValueError, "got 'j01'"),
        ("12", ValueError, "a bare number is a host server's request id"),
        (12, TypeError, "got 12"),
    ],
)
def test_a_bad_id_is_refused(value: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        hwpool.Job(value)  # type: ignore[arg-type]


def test_an_unknown_job_is_a_lookup_error_and_no_table_is_made(tmp_path: Path) -> None:
    with pytest.raises(UnknownJobError, match="no job 'j3': no job table"):
        hwpool.Job("j3", state_dir=tmp_path / "none").record()
    assert not (tmp_path / "none").exists()


def test_an_unknown_job_in_a_table(store: JobStore, state_dir: Path) -> None:
    with pytest.raises(LookupError, match="no job 'j3'"):
        _ = hwpool.Job("j3", state_dir=state_dir).state


def test_wait_returns_the_finished_record(store: JobStore, state_dir: Path) -> None:
    ended(store, "exit 3")
    assert hwpool.Job("j1", state_dir=state_dir).wait().exit_code == 3


def test_wait_times_out_and_the_job_goes_on(store: JobStore, state_dir: Path) -> None:
    add(store)
    with pytest.raises(TimeoutError, match="j1 is queued"):
        hwpool.Job("j1", state_dir=state_dir).wait(timeout=0.1)
    assert store.get("j1").state is JobState.QUEUED
    with pytest.raises(ValueError, match="timeout must be"):
        hwpool.Job("j1", state_dir=state_dir).wait(timeout=-1)


def test_wait_follows_a_running_job_to_its_end(
    store: JobStore, state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    found: list[JobRecord] = []
    waiter = threading.Thread(
        target=lambda: found.append(hwpool.Job("j1", state_dir=state_dir).wait())
    )
    waiter.start()
    assert launcher.end("exit 3") == 0
    waiter.join(BOUND)
    assert [(r.state, r.exit_code) for r in found] == [(JobState.FAILED, 3)]


def test_a_job_whose_launcher_died_is_recorded_lost(
    store: JobStore, state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    launcher.end("die")
    record = hwpool.Job("j1", state_dir=state_dir).wait(timeout=BOUND)
    assert record.state is JobState.LOST
    assert record.reason is not None and "launcher was gone" in record.reason


def test_wait_for_refuses_an_unknown_id_before_waiting(store: JobStore) -> None:
    add(store)
    with pytest.raises(UnknownJobError, match="'j7'"):
        wait_for(store, ["j1", "j7"])  # j1 is queued: it would wait for ever


# ----------------------------------------------------------------- logs
def test_logs_are_read_from_the_files_the_launcher_writes(
    store: JobStore, state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    job = hwpool.Job(launcher.job_id, state_dir=state_dir)
    launcher.send("out hello")
    launcher.send("err warning: é")
    assert launcher.end("exit 0") == 0
    assert job.logs() == "hello\n"
    assert job.logs(stderr=True) == "warning: é\n"


def test_a_job_not_started_has_no_output(store: JobStore, state_dir: Path) -> None:
    add(store)
    assert hwpool.Job("j1", state_dir=state_dir).logs() == ""


def planted(store: JobStore, state_dir: Path) -> Path:
    """A running job whose stdout log is a symbolic link to a file; the file."""
    (state_dir / "logs").mkdir(mode=0o700)
    secret = state_dir.parent / "secret.txt"
    secret.write_text("not the job's")
    (state_dir / "logs" / "j1.out").symlink_to(secret)
    add(store)
    store.mark_running("j1", pid=4242, pid_start=1, stdout_log=str(state_dir / "logs" / "j1.out"))
    return secret


def test_a_symbolic_link_for_a_log_is_refused(store: JobStore, state_dir: Path) -> None:
    planted(store, state_dir)
    with pytest.raises(UnsafePathError, match=r"j1\.out' is a symbolic link"):
        hwpool.Job("j1", state_dir=state_dir).logs()


def test_a_fifo_for_a_log_is_refused_without_blocking(store: JobStore, state_dir: Path) -> None:
    (state_dir / "logs").mkdir(mode=0o700)
    os.mkfifo(state_dir / "logs" / "j1.out")
    add(store)
    store.mark_running("j1", pid=4242, pid_start=1, stdout_log=str(state_dir / "logs" / "j1.out"))
    with pytest.raises(UnsafePathError, match="is not a regular file"):
        hwpool.Job("j1", state_dir=state_dir).logs()


def test_a_log_folder_that_is_a_link_is_refused(store: JobStore, state_dir: Path) -> None:
    elsewhere = state_dir.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "j1.out").write_text("planted")
    (state_dir / "logs").symlink_to(elsewhere)
    add(store)
    store.mark_running("j1", pid=4242, pid_start=1, stdout_log=str(state_dir / "logs" / "j1.out"))
    with pytest.raises(UnsafePathError, match="logs' is not a real directory"):
        hwpool.Job("j1", state_dir=state_dir).logs()


# ----------------------------------------------------------------- cancel and retry
def test_cancel_of_a_queued_job_cancels_its_dependents(store: JobStore, state_dir: Path) -> None:
    first = add(store)
    second = add(store, after=[first.id])
    third = add(store, after=[second.id])
    record = hwpool.Job(first.id, state_dir=state_dir).cancel()
    assert (record.state, record.reason) == (JobState.CANCELLED, "cancelled by its user")
    assert store.get(second.id).reason == "dependency j1 was cancelled"
    assert store.get(third.id).reason == "dependency j2 was cancelled"


def test_cancel_of_a_running_job_asks_its_launcher(
    store: JobStore, state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    record = hwpool.Job(launcher.job_id, state_dir=state_dir).cancel()
    assert (record.state, record.signal) == (JobState.CANCELLED, signal.SIGTERM)
    assert launcher.lines.next() == "cancelled"
    assert launcher.wait() == 0


def test_cancel_of_a_finished_job_changes_nothing(store: JobStore, state_dir: Path) -> None:
    ended(store, "exit 3")
    before = dump(store.path)
    assert hwpool.Job("j1", state_dir=state_dir).cancel().state is JobState.FAILED
    assert dump(store.path) == before


def test_retry_makes_a_new_job(store: JobStore, state_dir: Path) -> None:
    ended(store, "exit 3")
    again = hwpool.Job("j1", state_dir=state_dir).retry()
    assert again == hwpool.Job("j2", state_dir=state_dir)
    assert (again.state, again.record().retry_of) == (JobState.QUEUED, "j1")
    with pytest.raises(JobStateError, match="'j2' is queued: retry needs a finished job"):
        again.retry()


def test_an_end_recorded_meanwhile_wins_over_lost(store: JobStore) -> None:
    job = add(store)
    # this process's pid with another start time: a launcher that is no longer running
    stale = store.mark_running(job.id, pid=os.getpid(), pid_start=1)
    store.mark_finished(job.id, exit_code=0)  # its last write, before it exited
    assert record_if_dead(store, stale).state is JobState.SUCCEEDED
    running = store.mark_running(add(store).id, pid=os.getpid(), pid_start=1)
    assert record_if_dead(store, running).state is JobState.LOST


def test_submit_returns_the_jobs_handle(state_dir: Path) -> None:
    first = hwpool.submit(["true"], cwd="/", env={}, state_dir=state_dir)
    second = hwpool.submit(["true"], cwd="/", env={}, after=first, state_dir=state_dir)
    assert (first, second) == (
        hwpool.Job("j1", state_dir=state_dir), hwpool.Job("j2", state_dir=state_dir),
    )  # fmt: skip
    assert second.record().after == ("j1",)
    assert second.state is JobState.WAITING  # the supervisor finds no server: j1 waits
    with pytest.raises(ValueError, match="gpus must be a fraction"):
        hwpool.submit(["true"], gpus=3.5, cwd="/", env={}, state_dir=state_dir)
