"""No lease is left behind between the supervisor, a job's launcher and the server: each of
them SIGKILLed at each step of the hand-over (before the launcher takes the lease over,
after it took it and before the job is recorded running, while the job runs), and a
launcher that cannot be started at all. The lease comes back (bounded waits: on one GPU, a
second grant proves the first lease was freed) and the job's record says why.

Real server, a real supervisor process (``hwpool._cli._supervise``) whose launcher is the
real one held at a step while a file says so (tests/submit/paused_launcher.py), real jobs
(tests/run/job.py), the real table."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostserver import status_of
from hwpool._jobs._model import JobRecord, JobState
from hwpool._jobs._store import JobStore
from hwpool._jobs._supervisor import MAX_LAUNCH_FAILURES
from jobbox import JOB, LONG_BOUND, Box, wait_gone

PAUSED = str(Path(__file__).parent / "paused_launcher.py")
SUPERVISE = (
    "import sys; from hwpool._cli import _supervise as s; s.LAUNCHER[:] = sys.argv[2:]; "
    "raise SystemExit(s.main([sys.argv[1]]))"
)


@pytest.fixture
def steps(box: Box) -> Iterator[Path]:
    """The folder of the paused launchers' files; every launcher still paused is killed
    after the test."""
    folder = box.root / "steps"
    folder.mkdir()
    yield folder
    for path in folder.iterdir():
        pid = path.suffix.lstrip(".")
        if pid.isdigit():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def add_job(box: Box, name: str) -> str:
    """A whole-GPU job (tests/run/job.py NAME, waiting for NAME.go) in the box's table."""
    argv = [sys.executable, JOB, str(box.work), name, f"wait={name}.go"]
    with JobStore.open(box.state) as store:
        return store.add(argv, cwd=str(box.work), environment=dict(box.env)).id


def start_supervisor(box: Box, launcher: list[str]) -> int:
    """A supervisor of the box's table whose launcher argv is ``launcher``; its pid."""
    before = box.supervisor_pid()
    with open(box.state / "supervisor.log", "ab") as log:
        subprocess.run(
            [sys.executable, "-c", SUPERVISE, str(box.state), *launcher],
            env=box.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            timeout=LONG_BOUND,
            check=True,
        )  # fmt: skip  (it forks: the supervisor goes on, its pid in the lock)
    deadline = time.monotonic() + LONG_BOUND
    while (pid := box.supervisor_pid()) in (None, before):
        assert time.monotonic() < deadline, f"no supervisor ran\n{box.supervisor_log()}"
        time.sleep(0.02)
    assert pid is not None
    return pid


def paused_at(box: Box, steps: Path, step: str, *, not_pid: int = 0) -> int:
    """The pid of a launcher paused at ``step`` (other than ``not_pid``), once there is one."""
    deadline = time.monotonic() + LONG_BOUND
    while True:
        for path in steps.glob(f"{step}.*"):
            pid = int(path.suffix.lstrip("."))
            if pid != not_pid:
                return pid
        if time.monotonic() > deadline:
            leases = status_of(box.server.socket)["leases"]
            raise AssertionError(
                f"no launcher reached {step}; leases {leases}\n{box.supervisor_log()}"
            )
        time.sleep(0.02)


def leases(box: Box) -> list[dict[str, object]]:
    found: list[dict[str, object]] = status_of(box.server.socket)["leases"]
    return found


def until_no_lease(box: Box) -> None:
    deadline = time.monotonic() + LONG_BOUND
    while leases(box):
        assert time.monotonic() < deadline, f"a lease was never freed: {leases(box)}"
        time.sleep(0.05)


def noted(box: Box, job_id: str, words: str) -> JobRecord:
    return box.until(job_id, lambda job: words in (job.reason or ""), f"said {words!r}")


@pytest.mark.parametrize("step", ["take", "taken"])
def test_a_launcher_killed_before_it_started_the_job_leaves_no_lease_and_says_why(
    box: Box, steps: Path, step: str
) -> None:
    """SIGKILL (as the OOM killer sends) of the launcher before it took the lease over (the
    offer is the supervisor's) or after (the lease is the launcher's connection's): the
    lease is free again at once, the job queued again with why, and run once."""
    (steps / f"pause-{step}").touch()
    job_id = add_job(box, "a")
    start_supervisor(box, [sys.executable, PAUSED, str(steps)])
    first = paused_at(box, steps, step)
    assert len(leases(box)) == 1
    os.kill(first, signal.SIGKILL)
    second = paused_at(box, steps, step, not_pid=first)  # one GPU: granted again, so freed
    job = noted(box, job_id, "its launcher was killed by SIGKILL before it started the job")
    assert job.state is JobState.QUEUED
    assert f"queued again (1 of {MAX_LAUNCH_FAILURES} tries)" in (job.reason or "")
    (steps / f"go-{step}").touch()
    box.file("a.go").touch()
    ended = box.finished(job_id)
    assert (ended.state, ended.pid, ended.reason) == (JobState.SUCCEEDED, second, None)
    until_no_lease(box)


def test_a_launcher_killed_while_its_job_runs_frees_the_lease_and_the_job_is_lost(
    box: Box, steps: Path
) -> None:
    job_id = add_job(box, "a")
    start_supervisor(box, [sys.executable, PAUSED, str(steps)])
    box.wait_file("a.started")
    job = box.running(job_id)
    assert job.pid is not None
    os.kill(job.pid, signal.SIGKILL)
    lost = box.finished(job_id)
    assert lost.state is JobState.LOST
    assert "its launcher was killed by SIGKILL without recording its end" in (lost.reason or "")
    until_no_lease(box)


def test_a_supervisor_killed_before_its_launcher_took_the_lease_leaves_no_lease(
    box: Box, steps: Path
) -> None:
    """The offer dies with the supervisor's connection; the launcher's take is then refused,
    it says so on the job's record, and the next supervisor runs the job."""
    (steps / "pause-take").touch()
    job_id = add_job(box, "a")
    supervisor = start_supervisor(box, [sys.executable, PAUSED, str(steps)])
    launcher = paused_at(box, steps, "take")
    os.kill(supervisor, signal.SIGKILL)
    wait_gone(supervisor)
    until_no_lease(box)
    (steps / "go-take").touch()
    wait_gone(launcher)
    job = noted(box, job_id, "its launcher could not take its lease over")
    assert job.state is JobState.QUEUED
    (steps / "pause-take").unlink()
    start_supervisor(box, [sys.executable, PAUSED, str(steps)])
    box.file("a.go").touch()
    assert box.finished(job_id).state is JobState.SUCCEEDED
    until_no_lease(box)


def test_a_supervisor_killed_after_its_launcher_took_the_lease_stops_no_job(
    box: Box, steps: Path
) -> None:
    (steps / "pause-taken").touch()
    job_id = add_job(box, "a")
    supervisor = start_supervisor(box, [sys.executable, PAUSED, str(steps)])
    launcher = paused_at(box, steps, "taken")
    os.kill(supervisor, signal.SIGKILL)
    wait_gone(supervisor)
    (held,) = leases(box)
    assert held["pid"] == launcher  # the launcher's own now: it outlives the supervisor
    (steps / "go-taken").touch()
    box.file("a.go").touch()
    ended = box.finished(job_id)
    assert (ended.state, ended.pid) == (JobState.SUCCEEDED, launcher)
    until_no_lease(box)


def test_a_launcher_that_cannot_be_started_leaves_no_lease_and_the_job_says_why(
    box: Box,
) -> None:
    """``Popen`` of the launcher fails (as with EAGAIN at the user's process limit; here a
    launcher that may not be executed): the lease is taken back and released each time,
    and after MAX_LAUNCH_FAILURES the job is cancelled with why."""
    blocked = box.root / "launcher"
    blocked.write_text("#!/bin/sh\n")
    blocked.chmod(0o600)  # not executable: Popen raises PermissionError
    job_id = add_job(box, "a")
    start_supervisor(box, [str(blocked)])
    job = box.finished(job_id)
    assert job.state is JobState.CANCELLED
    assert "its launcher could not be started" in (job.reason or ""), job.reason
    assert "Permission denied" in (job.reason or "")
    until_no_lease(box)
    assert not box.file("a.started").exists()
