"""``hwpool jobs``, ``logs``, ``wait``, ``retry`` and ``cancel jN``, run as a user runs them:
``python -m hwpool`` processes on a real job table (``HWPOOL_STATE_DIR`` set to the test's),
with the stand-in launcher (tests/jobs/standin_launcher.py) as a running job's process."""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hostserver import BOUND, running_server
from hwpool._cli._jobs_cmds import _distinct_homes
from hwpool._jobs._store import JobStore
from jobprocs import Command, Standin, hwpool, job_env, kill_supervisor, supervisor_pid

ENV = {"PATH": "/usr/bin", "TOKEN": "secret-token-value"}


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The test's state directory; the supervisor that a retry starts there is killed after."""
    yield tmp_path / "state"
    kill_supervisor(tmp_path / "state")


@pytest.fixture
def store(state_dir: Path) -> Iterator[JobStore]:
    with JobStore.open(state_dir) as opened:
        yield opened


@pytest.fixture
def standins() -> Iterator[list[Standin]]:
    started: list[Standin] = []
    yield started
    for standin in started:
        standin.kill()


def add(store: JobStore, **fields: Any) -> str:
    fields.setdefault("cwd", "/srv/work")
    return store.add(["python", "train.py"], environment=ENV, **fields).id


def ran(store: JobStore, how: str, now: float | None = None) -> str:
    """A job that ran (or was cancelled before it did) and ended ``how``; its id."""
    job_id = add(store, now=now)
    if how == "cancelled-queued":
        store.mark_cancelled(job_id, now=now)
        return job_id
    store.mark_running(job_id, pid=4242, pid_start=1, gpu_ids=["GPU-8f2c1a3b-0000"], now=now)
    if how == "succeeded":
        store.mark_finished(job_id, exit_code=0, now=now)
    elif how == "exit 3":
        store.mark_finished(job_id, exit_code=3, now=now)
    elif how == "killed":
        store.mark_finished(job_id, signal=9, now=now)
    elif how == "timed-out":
        store.mark_timed_out(job_id, signal=15, now=now)
    elif how == "lost":
        store.mark_lost(job_id, now=now)
    elif how == "cancelled-running":
        store.mark_cancelled(job_id, signal=15, now=now)
    return job_id


def dump(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        return "\n".join(connection.iterdump())
    finally:
        connection.close()


def one_error(proc: Any, status: int, *fragments: str) -> None:
    """Exit ``status`` with one ``hwpool: error:`` line holding ``fragments``."""
    assert proc.returncode == status, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hwpool: error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def listed(state_dir: Path, *args: str) -> list[dict[str, Any]]:
    proc = hwpool(state_dir, "jobs", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    return found


# ----------------------------------------------------------------- jobs
def test_jobs_without_a_table_says_so_and_makes_nothing(state_dir: Path) -> None:
    proc = hwpool(state_dir, "jobs")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no jobs")
    assert "job ids look like j12; #12 in `hwpool status` is the host server's" in proc.stdout
    assert not state_dir.exists()
    assert listed(state_dir) == []


JSON_FIELDS = {
    "id", "user", "name", "argv", "cwd", "state", "finished", "exit_code", "signal",
    "signal_name", "exit", "gpus", "gpus_exact", "memory_mib", "priority", "time_limit_s",
    "after", "gpu_ids", "lease", "pid", "queued_at", "queued_at_iso", "started_at",
    "started_at_iso", "ended_at", "ended_at_iso", "waited_s", "ran_s", "reason",
    "stdout_log", "stderr_log", "retry_of", "after_any", "after_notok", "held_by",
    "gpu_share", "gpu_seconds", "cpu_user_s", "cpu_system_s", "max_rss_kib",
    "peak_gpu_memory_mib", "ended_by", "notify", "array_id", "array_index",
    "wait_reason", "wait_detail", "estimated_start",
}  # fmt: skip


def test_jobs_json_has_every_field_and_never_the_environment(
    store: JobStore, state_dir: Path
) -> None:
    killed = ran(store, "killed", now=1_800_000_000.0)
    queued = add(store, gpus=0.25, name="evaluate", after=[])
    jobs = listed(state_dir, "--all")
    assert [job["id"] for job in jobs] == [queued, killed]
    for job in jobs:
        assert set(job) == JSON_FIELDS
    assert "secret-token-value" not in json.dumps(jobs)
    assert jobs[0] | {"queued_at": 0, "queued_at_iso": "", "waited_s": 0} == {
        "id": "j2", "user": jobs[0]["user"], "name": "evaluate",
        "argv": ["python", "train.py"], "cwd": "/srv/work", "state": "queued",
        "finished": False, "exit_code": None, "signal": None, "signal_name": None,
        "exit": None, "gpus": 0.25, "gpus_exact": "1/4", "memory_mib": None, "priority": 0,
        "time_limit_s": None, "after": [], "gpu_ids": [], "lease": None, "pid": None,
        "queued_at": 0, "queued_at_iso": "", "started_at": None, "started_at_iso": None,
        "ended_at": None, "ended_at_iso": None, "waited_s": 0, "ran_s": None, "reason": None,
        "stdout_log": None, "stderr_log": None, "retry_of": None, "after_any": [],
        "after_notok": [], "held_by": None, "gpu_share": None, "gpu_seconds": None,
        "cpu_user_s": None, "cpu_system_s": None, "max_rss_kib": None,
        "peak_gpu_memory_mib": None, "ended_by": None, "notify": False, "array_id": None,
        "array_index": None,
        "wait_reason": None, "wait_detail": None, "estimated_start": None,  # no server
    }  # fmt: skip
    old = jobs[1]
    assert (old["state"], old["signal"], old["signal_name"], old["exit"]) == (
        "failed", 9, "SIGKILL", "SIGKILL",
    )  # fmt: skip
    assert old["gpu_ids"] == ["GPU-8f2c1a3b-0000"]
    assert old["ended_at_iso"] == "2027-01-15T08:00:00+00:00"
    assert (old["waited_s"], old["ran_s"]) == (0.0, 0.0)


def test_jobs_says_why_a_held_or_waiting_job_waits(store: JobStore, state_dir: Path) -> None:
    first = add(store)
    waiting = add(store, after=[first])
    held = add(store)
    store.hold(held, by="alice")
    jobs = {job["id"]: job for job in listed(state_dir)}
    assert (jobs[waiting]["wait_reason"], jobs[waiting]["wait_detail"]) == (
        "dependency", f"after {first}",
    )  # fmt: skip
    assert (jobs[held]["wait_reason"], jobs[held]["wait_detail"]) == ("held", "held by alice")
    assert jobs[first]["wait_reason"] is None  # queued: the server says why, and none runs
    assert all(job["estimated_start"] is None for job in jobs.values())
    text = hwpool(state_dir, "jobs").stdout.splitlines()
    row = next(line for line in text if line.startswith(waiting))
    assert row.endswith("dependency; start unknown")
    assert next(line for line in text if line.startswith(held)).endswith("held by alice")


def test_jobs_shows_recent_jobs_and_all_shows_every_one(store: JobStore, state_dir: Path) -> None:
    ran(store, "exit 3", now=time.time() - 3 * 86400)
    recent = ran(store, "succeeded")
    waiting = add(store, after=[recent])
    ran(store, "killed", now=time.time() - 3 * 86400)
    assert [job["id"] for job in listed(state_dir)] == [waiting, recent]
    assert [job["id"] for job in listed(state_dir, "--all")] == ["j4", "j3", "j2", "j1"]
    text = hwpool(state_dir, "jobs", "--all").stdout.splitlines()
    assert text[0].split() == ["ID", "NAME", "STATE", "EXIT", "GPUS", "QUEUED", "STARTED",
                               "ENDED", "WAITED", "RAN", "REASON"]  # fmt: skip
    assert text[1].split()[:5] == ["j4", "python", "failed", "SIGKILL", "GPU-8f2c1a3b"]
    assert text[4].split()[:4] == ["j1", "python", "failed", "3"]
    assert text[-1].startswith("(job ids look like j12")


def test_jobs_since_sets_the_window_and_state_filters(store: JobStore, state_dir: Path) -> None:
    old = ran(store, "exit 3", now=time.time() - 3 * 86400)
    recent = ran(store, "succeeded")
    queued = add(store)
    waiting = add(store, after=[queued])
    assert [job["id"] for job in listed(state_dir, "--since", "4d")] == [
        waiting, queued, recent, old,
    ]  # fmt: skip
    assert [job["id"] for job in listed(state_dir, "--since", "1:00:00")] == [
        waiting, queued, recent,
    ]  # fmt: skip
    # queued takes the jobs waiting on a dependency too (Slurm's PENDING)
    assert [job["id"] for job in listed(state_dir, "--state", "queued")] == [waiting, queued]
    assert [job["id"] for job in listed(state_dir, "--state", "waiting-on-dependency")] == [waiting]
    assert [job["id"] for job in listed(state_dir, "--state", "failed,succeeded")] == [recent]
    assert [job["id"] for job in listed(state_dir, "--state", "failed", "--all")] == [old]
    text = hwpool(state_dir, "jobs", "--since", "2h", "--state", "running").stdout
    assert "no jobs (queued, running or finished in the last 2h00m;" in text


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--state", "pending"), "'pending'"),
        (("--state", "queued,"), "got ''"),
        (("--since", "0"), "--since"),
        (("--since", "3 weeks"), "'3 weeks'"),
        (("--since", "1d", "--all"), "not allowed with argument"),
    ],
)
def test_jobs_refuses_a_bad_state_or_window(
    state_dir: Path, args: tuple[str, ...], fragment: str
) -> None:
    done = hwpool(state_dir, "jobs", *args)
    assert done.returncode == 2, done.stderr
    assert fragment in done.stderr and done.stdout == ""


def test_jobs_escapes_what_could_drive_the_terminal(store: JobStore, state_dir: Path) -> None:
    add(store, name="evil\x1b[2J\nforged line")
    out = hwpool(state_dir, "jobs").stdout
    assert "\x1b" not in out and "evil\\x1b[2J\\nforged line" in out


# ----------------------------------------------------------------- wait
@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("succeeded", 0), ("exit 3", 3), ("killed", 137), ("timed-out", 124), ("lost", 123),
        ("cancelled-running", 143), ("cancelled-queued", 143),
    ],
)  # fmt: skip
def test_wait_exits_with_the_jobs_status(
    store: JobStore, state_dir: Path, how: str, status: int
) -> None:
    job_id = ran(store, how)
    proc = hwpool(state_dir, "wait", job_id)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout.startswith(f"{job_id}: ")


def test_wait_exits_with_the_first_job_given_that_did_not_succeed(
    store: JobStore, state_dir: Path
) -> None:
    ok, failed, killed = ran(store, "succeeded"), ran(store, "exit 3"), ran(store, "killed")
    assert hwpool(state_dir, "wait", ok, killed, failed).returncode == 137
    assert hwpool(state_dir, "wait", failed, killed, ok).returncode == 3


def test_wait_blocks_until_a_running_job_ends(
    store: JobStore, state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    waiting = Command(state_dir, "wait", launcher.job_id)
    launcher.send("out working")
    assert launcher.end("exit 3") == 0
    assert waiting.finish() == (3, "")
    assert waiting.lines.rest() == ["j1: failed (exit 3) (status 3)"]


def test_wait_records_a_job_whose_launcher_died_as_lost(
    state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    launcher.end("die")
    proc = hwpool(state_dir, "wait", launcher.job_id)
    assert proc.returncode == 123, proc.stderr
    assert "lost" in proc.stdout and "launcher was gone" in proc.stdout


def test_wait_timeout_has_a_status_of_its_own(store: JobStore, state_dir: Path) -> None:
    job_id = add(store)
    proc = hwpool(state_dir, "wait", "--timeout", "0.2", job_id)
    one_error(proc, 75, "--timeout 0.2 s passed", "j1 is queued")


def test_wait_refuses_an_unknown_id_before_waiting(store: JobStore, state_dir: Path) -> None:
    queued = add(store)  # waiting for it would last for ever
    one_error(hwpool(state_dir, "wait", queued, "j9"), 2, "no job 'j9'")


# ----------------------------------------------------------------- logs
def test_logs_prints_the_jobs_output(state_dir: Path, standins: list[Standin]) -> None:
    standins.append(launcher := Standin(state_dir))
    launcher.send("out first")
    launcher.send("err oops")
    launcher.send("out second")
    assert launcher.end("exit 0") == 0
    out = hwpool(state_dir, "logs", launcher.job_id)
    assert (out.returncode, out.stdout, out.stderr) == (0, "first\nsecond\n", "")
    err = hwpool(state_dir, "logs", "--stderr", launcher.job_id)
    assert (err.returncode, err.stdout) == (0, "oops\n")


def test_logs_follows_the_output_as_it_is_written(state_dir: Path, standins: list[Standin]) -> None:
    standins.append(launcher := Standin(state_dir))
    follower = Command(state_dir, "logs", "-f", launcher.job_id)
    for index in range(3):
        launcher.send(f"out line {index}")
        assert follower.lines.next() == f"line {index}"
    launcher.send("out the last")
    assert launcher.end("exit 0") == 0
    assert follower.finish() == (0, "")
    assert follower.lines.rest() == ["the last"]


def test_logs_follow_waits_for_a_queued_job_to_start(
    store: JobStore, state_dir: Path, standins: list[Standin]
) -> None:
    job_id = add(store)
    follower = Command(state_dir, "logs", "-f", job_id)
    assert follower.errors.next() == "hwpool logs: j1 is queued: waiting for it to start"
    standins.append(launcher := Standin(state_dir, job_id))
    launcher.send("out started")
    assert follower.lines.next() == "started"
    assert launcher.end("exit 0") == 0
    assert follower.finish() == (0, "")


def test_ctrl_c_ends_following_quietly(state_dir: Path, standins: list[Standin]) -> None:
    standins.append(launcher := Standin(state_dir))
    follower = Command(state_dir, "logs", "-f", launcher.job_id)
    launcher.send("out hello")
    assert follower.lines.next() == "hello"
    follower.interrupt()
    assert follower.finish() == (130, "")


def test_logs_of_a_job_not_started(store: JobStore, state_dir: Path) -> None:
    job_id = add(store)
    one_error(hwpool(state_dir, "logs", job_id), 1, "j1 has not started (queued)")
    cancelled = ran(store, "cancelled-queued")
    one_error(hwpool(state_dir, "logs", "-f", cancelled), 1, "j2 never started (cancelled)")


def test_a_symbolic_link_planted_for_a_log_is_not_followed(
    store: JobStore, state_dir: Path
) -> None:
    (state_dir / "logs").mkdir(mode=0o700)
    secret = state_dir.parent / "secret.txt"
    secret.write_text("private text")
    (state_dir / "logs" / "j1.out").symlink_to(secret)
    job_id = add(store)
    store.mark_running(job_id, pid=4242, pid_start=1, stdout_log=str(state_dir / "logs" / "j1.out"))
    for args in (("logs",), ("logs", "-f")):
        proc = hwpool(state_dir, *args, job_id)
        one_error(proc, 1, "j1.out' is a symbolic link (never followed)")
        assert "private text" not in proc.stdout


# ----------------------------------------------------------------- cancel
def test_cancel_of_a_queued_job_and_its_dependents(store: JobStore, state_dir: Path) -> None:
    first = add(store)
    second = add(store, after=[first])
    proc = hwpool(state_dir, "cancel", first)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ("j1: cancelled (it was queued); with it 1 job that depended on it: j2\n")
    states = {job["id"]: (job["state"], job["reason"]) for job in listed(state_dir)}
    assert states == {
        "j1": ("cancelled", "cancelled by its user"),
        "j2": ("cancelled", "dependency j1 was cancelled"),
    }
    assert hwpool(state_dir, "cancel", second).stdout == (
        "j2: already cancelled: nothing to cancel\n"
    )


def test_cancel_of_a_waiting_job(store: JobStore, state_dir: Path) -> None:
    first = add(store)
    second = add(store, after=[first])
    proc = hwpool(state_dir, "cancel", second)
    assert proc.stdout == "j2: cancelled (it was waiting-on-dependency)\n"
    assert [job["state"] for job in listed(state_dir)] == ["cancelled", "queued"]


def test_cancel_of_a_running_job_ends_it_through_its_launcher(
    state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    proc = hwpool(state_dir, "cancel", launcher.job_id)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "j1: cancelled (it was running), ended by SIGTERM\n"
    assert launcher.lines.next() == "cancelled"
    assert launcher.wait() == 0
    job = listed(state_dir)[0]
    assert (job["state"], job["signal_name"]) == ("cancelled", "SIGTERM")
    assert hwpool(state_dir, "wait", "j1").returncode == 143


def test_cancel_of_a_running_job_whose_launcher_is_gone(
    state_dir: Path, standins: list[Standin]
) -> None:
    standins.append(launcher := Standin(state_dir))
    launcher.end("die")
    proc = hwpool(state_dir, "cancel", launcher.job_id)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("j1: lost: its launcher was gone")
    assert listed(state_dir)[0]["state"] == "lost"


def test_cancel_of_a_finished_job_changes_nothing(store: JobStore, state_dir: Path) -> None:
    job_id = ran(store, "exit 3")
    before = dump(store.path)
    proc = hwpool(state_dir, "cancel", job_id)
    assert (proc.returncode, proc.stdout) == (0, "j1: already failed (exit 3): nothing to cancel\n")
    assert dump(store.path) == before


@pytest.mark.parametrize(
    ("ids", "fragment"),
    [
        (["j1", "j0"], "argument ID: must be a job id such as 'j12', got 'j0'"),
        (["j01", "j1"], "got 'j01'"),
        (["j1", "x3"], "must be a job id such as 'j12' (`hwpool jobs`) or a server request id"),
        (["j1", "3x"], "got '3x'"),
        (["j1", "j9"], "no job 'j9'"),
    ],
)
def test_a_bad_or_unknown_id_cancels_nothing(
    store: JobStore, state_dir: Path, ids: list[str], fragment: str
) -> None:
    add(store)
    before = dump(store.path)
    proc = hwpool(state_dir, "cancel", *ids)
    one_error(proc, 2, fragment)
    assert proc.stdout == ""
    assert dump(store.path) == before


def test_job_ids_and_server_ids_mix(store: JobStore, state_dir: Path) -> None:
    job_id = add(store)
    with running_server("--gpus", "1") as server:
        proc = hwpool(state_dir, "cancel", "--socket", str(server.socket), job_id, "99")
    assert proc.returncode == 2
    assert proc.stdout == "j1: cancelled (it was queued)\n"
    assert proc.stderr == "hwpool: error: no lease or waiter #99\n"


def test_cancel_help_says_which_id_is_which(state_dir: Path) -> None:
    out = hwpool(state_dir, "cancel", "--help").stdout
    assert "j12, as `hwpool jobs` shows" in out and "12, as `hwpool status` shows #12" in out


# ----------------------------------------------------------------- retry
def test_retry_prints_the_new_job(store: JobStore, state_dir: Path) -> None:
    job_id = ran(store, "exit 3")
    proc = hwpool(state_dir, "retry", job_id)
    assert (proc.returncode, proc.stdout) == (0, "j2: a retry of j1, queued\n")
    proc = hwpool(state_dir, "retry", job_id, "--json")
    assert json.loads(proc.stdout) == {"id": "j3", "retry_of": "j1", "state": "queued"}
    assert [job["retry_of"] for job in listed(state_dir, "--all")] == ["j1", "j1", None]


def test_retry_starts_the_supervisor_and_cancel_only_wakes_one(
    store: JobStore, state_dir: Path
) -> None:
    first, second = add(store), ran(store, "exit 3")
    assert hwpool(state_dir, "cancel", first).returncode == 0
    assert supervisor_pid(state_dir) is None  # none ran: nothing held j1's request
    assert hwpool(state_dir, "retry", second).returncode == 0
    deadline = time.monotonic() + BOUND
    while (pid := supervisor_pid(state_dir)) is None:  # it forks: the lock comes after
        assert time.monotonic() < deadline, "no supervisor was started"
        time.sleep(0.02)
    assert Path(f"/proc/{pid}").exists()


def test_retry_of_an_unfinished_job_is_refused(store: JobStore, state_dir: Path) -> None:
    job_id = add(store)
    before = dump(store.path)
    one_error(hwpool(state_dir, "retry", job_id), 2, "ID 'j1' is queued: retry needs a finished")
    assert dump(store.path) == before


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("logs",), "the following arguments are required: ID"),
        (("logs", "12"), "a bare number is a host server's request id"),
        (("wait",), "the following arguments are required: ID"),
        (("wait", "--timeout", "soon", "j1"), "argument --timeout"),
        (("wait", "--timeout", "-1", "j1"), "argument --timeout"),
        (("wait", "j1", "J2"), "got 'J2'"),
        (("retry", "j01"), "got 'j01'"),
        (("retry", "j1", "j2"), "unrecognized arguments: j2"),
        (("jobs", "--user", "root", "--all-users"), "not allowed with argument --user"),
        (("jobs", "--user", "no-such-user-hwpool"), "--user: no user named"),
        (("logs", "j99"), "no job 'j99'"),
        (("retry", "j99"), "no job 'j99'"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    store: JobStore, state_dir: Path, args: tuple[str, ...], fragment: str
) -> None:
    ran(store, "exit 3")
    before = dump(store.path)
    one_error(hwpool(state_dir, *args), 2, fragment)
    assert dump(store.path) == before


def test_a_relative_state_directory_is_bad_usage(tmp_path: Path) -> None:
    proc = hwpool(Path("relative"), "jobs")
    one_error(proc, 2, "HWPOOL_STATE_DIR must be an absolute path, got 'relative'")


def test_an_unsafe_state_directory_is_refused(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    JobStore.open(state_dir).close()
    state_dir.chmod(0o755)
    for args in (("jobs",), ("wait", "j1"), ("logs", "j1"), ("retry", "j1"), ("cancel", "j1")):
        status = 125 if args[0] == "wait" else 1  # wait: not 1, which a job may exit with
        one_error(hwpool(state_dir, *args), status, "may be read by others (mode 0755)")


def test_a_reader_that_goes_away_ends_jobs_quietly(store: JobStore, state_dir: Path) -> None:
    for _ in range(600):  # over the pipe's buffer, so that writing fails once it is closed
        add(store)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwpool", "jobs", "--json"], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=job_env(state_dir),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.read(10) == b'[\n {\n  "id'
    proc.stdout.close()
    _, err = proc.communicate(timeout=BOUND * 3)
    assert (proc.returncode, err) == (0, b"")


def test_all_users_reads_a_shared_home_once_as_its_owner(tmp_path: Path) -> None:
    def entry(name: str, uid: int, home: Path) -> pwd.struct_passwd:
        return pwd.struct_passwd((name, "x", uid, uid, "", str(home), "/bin/sh"))

    shared = tmp_path / "shared"
    (shared / ".local" / "state" / "hwpool").mkdir(parents=True)
    owner = os.getuid()
    entries = [
        entry("a", 5001, tmp_path / "none"), entry("b", 5002, tmp_path / "none"),
        entry("c", 5003, shared), entry("me", owner, shared), entry("me-again", owner, shared),
        entry("d", 5004, tmp_path / "d"),
    ]  # fmt: skip
    assert [user.pw_name for user in _distinct_homes(entries)] == ["me", "d"]
