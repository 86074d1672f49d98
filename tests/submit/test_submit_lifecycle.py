"""A job's life where it meets other processes: a second launcher of a running job, the
server request behind a queued job cancelled with ``hwpool cancel N``, and a job's time
limit counted on the server's clock. Real server, supervisor, launchers and jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import hwpool
from hostserver import status_of
from hwpool._cli._supervise import LAUNCHER
from hwpool._jobs._model import JobState
from hwpool._jobs._store import JobStore
from hwpool._jobs._supervisor import GRACE_S, LIMIT_MARGIN_S
from jobbox import JOB, LONG_BOUND, Box


def launch(box: Box, job_id: str, lease_id: int, ticket: str) -> subprocess.CompletedProcess[str]:
    """A launcher of ``job_id`` started as the supervisor starts one, with this hand-over."""
    handoff = {"job": job_id, "lease": lease_id, "ticket": ticket, "socket": str(box.server.socket)}
    return subprocess.run(
        [*LAUNCHER, str(box.state)], input=json.dumps(handoff) + "\n", capture_output=True,
        text=True, env=box.env, timeout=LONG_BOUND, check=False,
    )  # fmt: skip


def waiting_request(box: Box, job_id: str) -> int:
    """The server's id of the request that waits for ``job_id``'s share (bounded wait)."""
    deadline = time.monotonic() + LONG_BOUND
    while True:
        for waiter in status_of(box.server.socket)["waiting"]:
            if (waiter.get("name") or "").split(" ")[0] == job_id:
                return int(waiter["id"])
        assert time.monotonic() < deadline, f"{job_id} never waited\n{box.supervisor_log()}"
        time.sleep(0.05)


def test_a_second_launcher_of_a_running_job_leaves_its_logs_alone(box: Box) -> None:
    """A launcher that is turned away (the job runs already) must not truncate the logs the
    running job writes to."""
    job_id = box.submit("--gpus", "0.5", job=["a", "wait=a.go"])
    box.wait_file("a.started")
    job = box.running(job_id)
    assert job.stderr_log is not None
    log = Path(job.stderr_log)
    before = log.read_bytes()
    assert f"{job_id} runs on".encode() in before
    with hwpool.connect(box.server.socket) as pool:
        lease = pool.lease(0.5)
        with lease:
            ident, ticket = lease.id, lease.hand_over()
        assert ident is not None
        done = launch(box, job_id, ident, ticket)
    assert done.returncode == 0, done.stderr
    assert log.read_bytes().startswith(before)
    box.file("a.go").touch()
    assert box.finished(job_id).state is JobState.SUCCEEDED
    assert log.read_bytes().startswith(before)


def test_cancelling_the_request_behind_a_queued_job_cancels_the_job_with_why(box: Box) -> None:
    first = box.submit(job=["a", "wait=a.go"])
    second = box.submit(job=["b"])
    box.running(first)
    request = waiting_request(box, second)
    done = box.hwpool("cancel", str(request))
    assert done.returncode == 0, done.stderr
    job = box.until(second, lambda job: job.state.finished, "finished")
    assert job.state is JobState.CANCELLED
    assert job.reason is not None and f"request #{request} was cancelled by" in job.reason
    box.file("a.go").touch()
    assert box.finished(first).state is JobState.SUCCEEDED
    assert box.job(second).state is JobState.CANCELLED
    assert not box.file("b.started").exists()


def test_a_jobs_time_limit_counts_from_its_grant_as_the_server_counts_it(box: Box) -> None:
    """The server counts a lease's time limit from its grant; so does the launcher, however
    late it starts (here: after the job's whole time limit has passed since the grant, as on
    a loaded machine). It then never starts the job, records it timed out, and gives the
    lease back itself, before the server's limit (the time limit, the grace and a margin)."""
    limit = 1
    argv = [sys.executable, JOB, str(box.work), "a", "wait=never"]
    with JobStore.open(box.state) as store:
        job_id = store.add(argv, cwd=str(box.work), environment=dict(box.env), time_limit=limit).id
    with hwpool.connect(box.server.socket) as pool:
        lease = pool.lease(1.0, limit_s=limit + GRACE_S + LIMIT_MARGIN_S)
        with lease:
            granted = time.monotonic()
            while time.monotonic() < granted + limit + 0.2:  # the job's time limit passes
                time.sleep(0.05)
            ident, ticket = lease.id, lease.hand_over()
        assert ident is not None
        done = launch(box, job_id, ident, ticket)
    assert done.returncode == 0, done.stderr
    job = box.job(job_id)
    assert job.state is JobState.TIMED_OUT, job
    assert not box.file("a.started").exists()
    assert status_of(box.server.socket)["leases"] == []
    assert not any("time limit ran out" in line for line in box.server.lines)
