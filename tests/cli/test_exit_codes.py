"""One exit status per meaning (docs/cli.md, "Exit statuses", and ``hwpool._exits``): each
meaning, from a real ``hwpool`` process, gives its own status, and no status stands for two
of hwpool's meanings (issue 35: 125 said "no server", "your request was cancelled" and "the
job was lost")."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import hwpool
from hostserver import BOUND, ENV, Server, run_cli, status_of
from hwpool._jobs._store import JobStore
from jobprocs import hwpool as hwpool_in
from runproc import Run, eventually, waiting_pids


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hwx", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def one_gpu(sockdir: Path) -> Iterator[Server]:
    server = Server(sockdir / "s.sock", "--gpus", "1").ready()
    yield server
    server.kill()


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``hwpool ARGS`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args], capture_output=True, text=True,
        env=env or ENV, timeout=BOUND * 3, check=False,
    )  # fmt: skip


def test_the_named_statuses_are_distinct() -> None:
    """Every meaning of the table has a status of its own."""
    _exits = importlib.import_module("hwpool._exits")  # new in issue 35
    statuses = [value for name, value in vars(_exits).items() if name.isupper()]
    assert len(statuses) == len(set(statuses)), statuses


def test_bad_usage_is_2() -> None:
    done = run("run", "--gpus", "0", "--", "true")
    assert done.returncode == 2, done.stderr


def test_no_server_is_125_for_run_and_submit(sockdir: Path) -> None:
    """hwpool itself failed: no server answers (and none is started)."""
    absent = str(sockdir / "none.sock")
    env = {**ENV, "HWPOOL_AUTOSTART": "0", "HWPOOL_SYSTEM_SOCKET": "",
           "HWPOOL_STATE_DIR": str(sockdir / "state")}  # fmt: skip
    assert run("run", "--socket", absent, "--", "true", env=env).returncode == 125
    done = run("submit", "--socket", absent, "--", "true", env=env)
    assert done.returncode == 125, done.stderr


def test_a_command_not_found_is_127_and_one_not_runnable_is_126(
    one_gpu: Server, sockdir: Path
) -> None:
    plain = sockdir / "plain"
    plain.write_text("not a program\n")
    where = ("--socket", str(one_gpu.socket))
    assert run("run", *where, "--", str(sockdir / "absent")).returncode == 127
    assert run("run", *where, "--", str(plain)).returncode == 126


def test_the_job_ran_past_its_time_is_124(one_gpu: Server) -> None:
    done = run("run", "--socket", str(one_gpu.socket), "--time", "0.5", "--", "sleep", "30")
    assert done.returncode == 124, done.stderr


def test_giving_up_waiting_in_the_queue_is_75_not_124(one_gpu: Server, sockdir: Path) -> None:
    """``run --timeout`` passed in the queue: the job never ran, so not a time-out of the job
    (124) but "try again later", as ``hwpool wait --timeout``."""
    with hwpool.connect(one_gpu.socket) as pool, pool.lease(1.0):
        waiting = Run(one_gpu, sockdir, "a", options=("--timeout", "0.2"))
        code, err = waiting.finish()
    assert code == 75, err
    assert not (sockdir / "a.started").exists()


def test_a_request_cancelled_while_it_waits_is_143_as_a_cancelled_job(
    one_gpu: Server, sockdir: Path
) -> None:
    """``hwpool cancel`` of the request of a waiting ``hwpool run``: cancelled, as ``hwpool
    wait`` says of a job cancelled before it ran (143), not "hwpool failed" (125)."""
    with hwpool.connect(one_gpu.socket) as pool, pool.lease(1.0):
        waiting = Run(one_gpu, sockdir, "a")
        eventually(lambda: waiting.pid in waiting_pids(one_gpu.socket), "a waits", waiting)
        (request,) = status_of(one_gpu.socket)["waiting"]
        assert run_cli("cancel", str(request["id"]), "--socket", str(one_gpu.socket))[0] == 0
        code, err = waiting.finish()
    assert code == 143, err
    assert not (sockdir / "a.started").exists()


def test_a_lost_job_is_its_own_status_for_wait(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with JobStore.open(state) as store:
        job = store.add(["python", "train.py"], cwd="/", environment={})
        store.mark_running(job.id, pid=4242, pid_start=1)
        store.mark_lost(job.id, reason="nothing watched it")
    done = hwpool_in(state, "wait", job.id)
    assert done.returncode == 123, done.stderr
    assert "lost" in done.stdout


def test_wait_on_a_table_it_cannot_use_is_125_not_a_jobs_1(tmp_path: Path) -> None:
    """A job may exit 1; ``hwpool wait`` failing itself says 125."""
    state = tmp_path / "state"
    with JobStore.open(state) as store:
        job = store.add(["python", "train.py"], cwd="/", environment={})
    os.chmod(state, 0o777)  # unsafe: anyone could plant a table
    done = hwpool_in(state, "wait", job.id)
    assert done.returncode == 125, done.stderr
    assert "hwpool: error:" in done.stderr
