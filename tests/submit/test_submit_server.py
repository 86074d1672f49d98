"""``hwpool submit`` and the server the shell chose (issue 35): the job is queued for that
server or refused at once, naming why, with nothing queued: a supervisor that serves another
server, a server that does not serve this user (not a member of its group), a request no
server of that size could ever grant. Real servers, real ``hwpool submit`` processes, real
supervisors and jobs, real Unix users."""

from __future__ import annotations

import contextlib
import grp
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostserver import BOUND, Server, status_of
from hwpool._jobs._store import JobStore
from jobbox import JOB, Box
from users import Users


@pytest.fixture
def other_server(box_root: Path) -> Iterator[Server]:
    """A second server, with two GPUs, beside the box's (one GPU)."""
    server = Server(box_root / "b.sock", "--gpus", "2").ready()
    yield server
    server.kill()


def job_ids(box: Box) -> list[str]:
    if not (box.state / "jobs.db").exists():
        return []
    with JobStore.open(box.state) as store:
        return [job.id for job in store.list()]


def nothing_on(server: Server) -> None:
    status = status_of(server.socket)
    assert status["leases"] == [] and status["waiting"] == [], status


# ----------------------------------------------------------------- the server the shell chose
def test_submit_refuses_a_server_other_than_the_one_its_supervisor_serves(
    box: Box, other_server: Server
) -> None:
    """The supervisor runs (for the box's server, A) with a job; a shell that chooses B, by
    HWPOOL_SOCKET or by --socket, is refused naming both, and nothing is queued."""
    first = box.submit(job=["a", "wait=a.go"])
    box.running(first)
    a, b = str(box.server.socket), str(other_server.socket)
    by_env = box.hwpool("submit", "--", "true", env={**box.env, "HWPOOL_SOCKET": b})
    by_option = box.hwpool("submit", "--socket", b, "--", "true")
    for done in (by_env, by_option):
        assert done.returncode == 2, done.stderr
        assert a in done.stderr and b in done.stderr, done.stderr
        assert done.stdout == ""
    assert job_ids(box) == [first]
    nothing_on(other_server)
    box.file("a.go").touch()
    assert box.finished(first).exit_code == 0


def test_submit_queues_the_job_for_the_server_the_shell_chose(
    box: Box, other_server: Server
) -> None:
    """No supervisor runs: ``--socket B`` (HWPOOL_SOCKET says A) starts one for B, and the job
    holds its lease there, not on A."""
    done = box.hwpool(
        "submit", "--socket", str(other_server.socket), "--gpus", "2", "--",
        sys.executable, JOB, str(box.work), "b", "wait=b.go",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    box.running(job_id)
    (lease,) = status_of(other_server.socket)["leases"]
    assert lease["name"].startswith(job_id)
    nothing_on(box.server)
    box.file("b.go").touch()
    assert box.finished(job_id).exit_code == 0


# ----------------------------------------------------------------- what no server could grant
@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        (["--gpus", "3"], ["--gpus 3", "has 1 GPU"]),
        (["--mem", "1GiB"], ["--mem 1GiB", "shares fractions"]),
    ],
)
def test_a_request_the_server_can_never_grant_is_refused_at_submit(
    box: Box, options: list[str], fragments: list[str]
) -> None:
    done = box.hwpool("submit", *options, "--", "true")
    assert done.returncode == 2, done.stderr
    for fragment in [*fragments, str(box.server.socket)]:
        assert fragment in done.stderr, done.stderr
    assert done.stderr.startswith("hwpool: error: submit: ")
    assert job_ids(box) == [] and box.supervisor_pid() is None
    nothing_on(box.server)


def test_from_a_file_is_refused_whole_when_no_server_could_grant_it(box: Box) -> None:
    sweep = box.work / "sweep.txt"
    sweep.write_text("true\ntrue\n")
    done = box.hwpool("submit", "--gpus", "2", "--from", str(sweep))
    assert done.returncode == 2 and "--gpus 2" in done.stderr, done.stderr
    assert job_ids(box) == []


def test_no_server_is_refused_at_submit_and_nothing_is_queued(box: Box) -> None:
    gone = str(box.root / "none.sock")
    done = box.hwpool("submit", "--", "true", env={**box.env, "HWPOOL_SOCKET": gone})
    assert done.returncode == 125, done.stderr
    assert gone in done.stderr and done.stderr.startswith("hwpool: error: submit: ")
    assert job_ids(box) == [] and box.supervisor_pid() is None


# ----------------------------------------------------------------- a user the server refuses
def _kill_supervisor(state: Path) -> None:
    """SIGKILL a supervisor that old code left running for the outsider (its pid is in the
    lock), so that the user can be deleted."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((state / "supervisor.lock").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)


def test_a_non_member_is_refused_at_submit_naming_the_group(users: Users, box_root: Path) -> None:
    """A server for the members of a group; a user not in it submits: exit 77, the group
    named, no server of her own suggested, nothing queued, no supervisor started. ``hwpool
    run`` and ``hwpool status`` say the same with the same status."""
    gid = users.group()
    users.user([gid])  # a member, so that the group is not empty
    outsider = users.user()
    os.chmod(box_root, 0o755)
    path = box_root / "shared" / "s.sock"
    server = Server(path, "--gpus", "1", "--group", str(gid)).ready()
    home = box_root / "home"
    home.mkdir(mode=0o755)
    os.chown(home, outsider.uid, outsider.gid)
    state = home / "state"
    env = users.env(
        HOME=str(home), HWPOOL_SOCKET=str(path), HWPOOL_STATE_DIR=str(state),
        HWPOOL_AUTOSTART="0", HWPOOL_SYSTEM_SOCKET="",
    )  # fmt: skip
    group = grp.getgrgid(gid).gr_name
    try:
        for args in (["submit", "--", "true"], ["run", "--", "true"], ["status"]):
            done = subprocess.run(
                users.command(outsider, ["-m", "hwpool", *args]), capture_output=True,
                text=True, env=env, timeout=BOUND * 3, check=False, cwd="/",
            )  # fmt: skip
            assert done.returncode == 77, done.stderr
            assert f"group {group!r}" in done.stderr and str(path) in done.stderr, done.stderr
            assert "`hwpool serve" not in done.stderr and "your own" not in done.stderr
        assert not (state / "jobs.db").exists() and not (state / "supervisor.lock").exists()
        assert status_of(path)["waiting"] == []
    finally:
        _kill_supervisor(state)
        server.kill()
