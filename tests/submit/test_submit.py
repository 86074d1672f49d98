"""``hwpool submit`` end to end: real submit processes, the real supervisor and launchers they
start, a real server, real jobs (tests/run/job.py), the real table. Every wait is bounded;
orderings are proven with the files the jobs write and the table's records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest

from hostserver import Server, status_of
from hwpool._jobs._model import JobState
from hwpool._jobs._procs import CANCEL_SIGNAL, signal_if_running
from hwpool._jobs._store import JobStore
from hwpool._jobs._submit import default_name
from jobbox import JOB, Box, wait_gone


def test_a_job_submitted_from_a_shell_that_is_killed_runs_and_records_its_exit(box: Box) -> None:
    """The issue's first check: a shell in a new session submits, then the whole session is
    SIGKILLed; the job still runs to its end and the table has its exit status."""
    script = (
        f"{sys.executable} -m hwpool submit -- {sys.executable} {JOB} {box.work} a "
        f"wait=a.go exit=3 > {box.root}/id; kill -KILL $$"
    )
    shell = subprocess.Popen(["sh", "-c", script], env=box.env, start_new_session=True)
    assert shell.wait(30) == -signal.SIGKILL
    job_id = (box.root / "id").read_text().strip()
    box.running(job_id)
    os.killpg(shell.pid, signal.SIGKILL) if _group_alive(shell.pid) else None
    box.file("a.go").touch()
    job = box.finished(job_id)
    assert (job.state, job.exit_code, job.signal) == (JobState.FAILED, 3, None)
    assert json.loads(box.wait_file("a.started").read_text())["CUDA_VISIBLE_DEVICES"] is not None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_job_sees_its_lease_its_cwd_and_the_submitting_environment(box: Box) -> None:
    env = {**box.env, "MY_SETTING": "kept", "MY_OTHER": "replaced"}
    done = box.hwpool(
        "submit", "--gpus", "0.5", "--cwd", str(box.root), "--env", "MY_OTHER=x=1",
        "--env", "MY_ADDED=", "--", sys.executable, "-c",
        "import json, os; json.dump({'cwd': os.getcwd(), 'env': dict(os.environ), "
        "'stdin': os.read(0, 10).decode()}, open('seen.json', 'w'))", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = box.finished(done.stdout.strip())
    assert job.state is JobState.SUCCEEDED, box.supervisor_log()
    seen = json.loads((box.root / "seen.json").read_text())
    assert seen["cwd"] == str(box.root)
    assert seen["env"]["MY_SETTING"] == "kept"
    assert (seen["env"]["MY_OTHER"], seen["env"]["MY_ADDED"]) == ("x=1", "")  # --env over it
    assert seen["env"]["HWPOOL_JOB_ID"] == job.id
    assert json.loads(seen["env"]["HWPOOL_LEASE"])["fraction"] == 0.5
    assert seen["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"  # lease.env()'s knobs
    assert seen["stdin"] == ""  # /dev/null
    assert list(job.gpu_ids) == seen["env"]["CUDA_VISIBLE_DEVICES"].split(",")


@pytest.mark.parametrize(
    ("words", "state", "exit_code", "signum"),
    [
        (["exit=0"], JobState.SUCCEEDED, 0, None),
        (["exit=3"], JobState.FAILED, 3, None),
        (["kill"], JobState.FAILED, None, signal.SIGKILL),
    ],
)
def test_the_table_records_how_the_job_ended(
    box: Box, words: list[str], state: JobState, exit_code: int | None, signum: int | None
) -> None:
    job = box.finished(box.submit(job=["a", *words]))
    assert (job.state, job.exit_code, job.signal) == (state, exit_code, signum)


def test_output_goes_to_the_job_logs(box: Box) -> None:
    done = box.hwpool(
        "submit",
        "--",
        sys.executable,
        "-c",
        "import sys; print('out'); print('err', file=sys.stderr)",
    )
    job = box.finished(done.stdout.strip())
    assert job.stdout_log is not None and job.stderr_log is not None
    assert Path(job.stdout_log).read_text() == "out\n"
    assert "err\n" in Path(job.stderr_log).read_text()
    assert os.stat(job.stdout_log).st_mode & 0o077 == 0


def test_a_job_past_its_time_limit_is_ended_and_recorded_timed_out(box: Box) -> None:
    job_id = box.hwpool("submit", "--time", "1", "--", "sleep", "30").stdout.strip()
    job = box.finished(job_id)
    assert job.state is JobState.TIMED_OUT
    assert job.signal == signal.SIGTERM
    assert job.ended_at is not None and job.started_at is not None
    assert job.ended_at - job.started_at < 20


def test_after_runs_b_only_once_a_succeeded(box: Box) -> None:
    a = box.submit(job=["a", "wait=a.go"])
    b = box.submit("--after", a, job=["b"])
    box.running(a)
    assert box.job(b).state is JobState.WAITING
    assert not box.file("b.started").exists()
    box.file("a.go").touch()
    assert box.finished(b).state is JobState.SUCCEEDED
    assert json.loads(box.file("b.started").read_text())["files"].count("a.done") == 1


def test_after_a_failure_the_dependent_job_is_cancelled_and_never_runs(box: Box) -> None:
    a = box.submit(job=["a", "wait=a.go", "exit=1"])
    b = box.submit("--after", a, job=["b"])
    box.file("a.go").touch()
    job = box.finished(b)
    assert (job.state, job.reason) == (JobState.CANCELLED, f"dependency {a} failed (exit 1)")
    assert box.job(a).state is JobState.FAILED
    assert not box.file("b.started").exists()


def test_jobs_wait_for_the_gpu_one_at_a_time_and_in_order(box: Box) -> None:
    """One GPU: three whole-GPU jobs run one after another, in submit order, each alone."""
    ids = [box.submit(job=[name, f"wait={name}.go"]) for name in "abc"]
    for name, job_id in zip("abc", ids, strict=True):
        box.running(job_id)
        started = json.loads(box.wait_file(f"{name}.started").read_text())
        others = [other for other in "abc" if other != name]
        assert not any(f"{o}.started" in started["files"] and f"{o}.done" not in
                       started["files"] for o in others)  # fmt: skip
        box.file(f"{name}.go").touch()
        assert box.finished(job_id).state is JobState.SUCCEEDED


def test_cancelling_a_running_job_ends_it_and_records_it_cancelled(box: Box) -> None:
    job_id = box.submit(job=["a", "wait=never"])
    job = box.running(job_id)
    box.wait_file("a.started")
    assert job.pid is not None
    assert signal_if_running(job.pid, job.pid_start, CANCEL_SIGNAL)
    ended = box.finished(job_id)
    assert ended.state is JobState.CANCELLED
    assert ended.signal == signal.SIGTERM
    assert status_of(box.server.socket)["leases"] == []


def test_a_killed_supervisor_loses_no_job_and_starts_none_twice(box: Box) -> None:
    """SIGKILL the supervisor while one job runs and one waits for the only GPU: the running
    one goes on (its launcher holds the lease) and is recorded; the waiting one runs once,
    after it, under the supervisor the next submit starts."""
    a = box.submit(job=["a", "wait=a.go"])
    b = box.submit(job=["b"])
    box.running(a)
    supervisor = box.supervisor_pid()
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    wait_gone(supervisor)
    assert box.job(a).state is JobState.RUNNING
    assert len(status_of(box.server.socket)["leases"]) == 1  # a's lease outlived it
    c = box.submit(job=["c"])  # starts a new supervisor, which adopts a's launcher
    box.until(a, lambda _: "adopted" in box.supervisor_log(), "adopted by the new supervisor")
    box.file("a.go").touch()  # only now: a job that ended before it looked is not adopted
    for job_id in (a, b, c):
        assert box.finished(job_id).state is JobState.SUCCEEDED, box.supervisor_log()
    started = json.loads(box.file("b.started").read_text())
    assert "a.done" in started["files"]  # b ran only once a had ended: no GPU granted twice
    assert "adopted" in box.supervisor_log()


def test_a_killed_server_loses_no_job(box: Box) -> None:
    """SIGKILL the host server while a job runs and another waits: after the restart the
    running job's launcher reclaims its lease, the waiting job runs after it, once."""
    a = box.submit(job=["a", "wait=a.go"])
    b = box.submit(job=["b"])
    box.running(a)
    box.wait_file("a.started")
    box.server.kill()
    box.server = Server(box.server.socket, "--gpus", "1").ready()
    box.server.wait_for("reclaim")
    box.file("a.go").touch()
    assert box.finished(a).state is JobState.SUCCEEDED, box.supervisor_log()
    assert box.finished(b).state is JobState.SUCCEEDED, box.supervisor_log()
    assert "a.done" in json.loads(box.file("b.started").read_text())["files"]


def test_a_job_whose_launcher_is_killed_is_recorded_lost(box: Box) -> None:
    job_id = box.submit(job=["a", "wait=never"])
    box.wait_file("a.started")
    job = box.running(job_id)
    assert job.pid is not None
    os.kill(job.pid, signal.SIGKILL)
    lost = box.finished(job_id)
    assert lost.state is JobState.LOST
    assert "launcher" in (lost.reason or "")
    started = json.loads(box.file("a.started").read_text())
    wait_gone(started["pid"])  # the job died with its launcher (its GPU is free again)


def test_a_cancelled_queued_job_never_runs(box: Box) -> None:
    a = box.submit(job=["a", "wait=a.go"])
    b = box.submit(job=["b"])
    box.running(a)
    with JobStore.open(box.state) as store:
        store.mark_cancelled(b)
    box.file("a.go").touch()
    box.finished(a)
    assert box.job(b).state is JobState.CANCELLED
    assert not box.file("b.started").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--gpus", "0.5", "--mem", "1GiB"], "give --gpus or --mem, not both"),
        (["--time", "soon"], "--time"),
        (["--after", "j9"], "j9"),
        (["--after", "12"], "12"),
        (["--gpus", "3.5"], "--gpus"),
        (["--priority", "5000"], "--priority"),
        (["--cwd", "/no/such/folder"], "/no/such/folder"),
    ],
)
def test_bad_input_queues_nothing(box: Box, options: list[str], message: str) -> None:
    done = box.hwpool("submit", *options, "--", "true")
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""
    if (box.state / "jobs.db").exists():
        with JobStore.open(box.state) as store:
            assert store.list(include_finished=True) == []


def test_a_command_that_cannot_be_found_is_refused_at_submit(box: Box) -> None:
    """127 and 126, as ``hwpool run`` and shells say (hwpool._exits)."""
    done = box.hwpool("submit", "--", "no-such-command-hwpool")
    assert done.returncode == 127
    assert "no-such-command-hwpool" in done.stderr and "not found" in done.stderr
    plain = box.work / "plain.sh"
    plain.write_text("true\n")
    done = box.hwpool("submit", "--", "./plain.sh")
    assert done.returncode == 126 and "not an executable file" in done.stderr, done.stderr
    assert not (box.state / "jobs.db").exists() or box.job_ids() == []


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["python", "train.py", "--lr", "1"], "python train.py"),
        (["/usr/bin/python3", "/srv/exp/train.py"], "python3 train.py"),
        (["sleep", "30"], "sleep 30"),
        (["./run.sh", "--fast"], "run.sh"),
        (["true"], "true"),
    ],
)
def test_a_job_is_named_after_its_first_two_words(argv: list[str], name: str) -> None:
    assert default_name(argv) == name


def test_the_supervisor_prunes_finished_jobs_and_their_logs_past_the_retention(box: Box) -> None:
    old = box.finished(box.submit(job=["a"]))
    assert old.stdout_log is not None and Path(old.stdout_log).exists()
    supervisor = box.supervisor_pid()
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    wait_gone(supervisor)
    box.env["HWPOOL_JOBS_KEEP_COUNT"] = "1"  # the newest finished job only
    new = box.submit(job=["b", "wait=b.go"])
    box.running(new)  # the new supervisor has started, and pruned first
    with JobStore.open(box.state) as store:
        assert [job.id for job in store.list(include_finished=True)] == [new, old.id]
    box.file("b.go").touch()
    box.finished(new)
    os.kill(box.supervisor_pid() or 0, signal.SIGKILL)
    box.submit(job=["c"])
    box.finished(f"j{int(new[1:]) + 1}")
    with JobStore.open(box.state) as store:
        kept = [job.id for job in store.list(include_finished=True)]
    assert old.id not in kept
    assert not Path(old.stdout_log).exists()


def test_a_bad_retention_setting_is_refused_before_anything_is_queued(box: Box) -> None:
    env = {**box.env, "HWPOOL_JOBS_KEEP": "a fortnight"}
    done = box.hwpool("submit", "--", "true", env=env)
    assert done.returncode == 2
    assert "HWPOOL_JOBS_KEEP" in done.stderr and "a fortnight" in done.stderr
    assert not (box.state / "jobs.db").exists()


RUN_ONCE = """
import os, sys, time
name, folder = sys.argv[1], sys.argv[2]
def note(word):
    with open(os.path.join(folder, "runs"), "a") as runs:
        runs.write(f"{word} {name}\\n")
note("start")
while not os.path.exists(os.path.join(folder, name + ".go")):
    time.sleep(0.02)
note("end")
"""


def test_killing_the_supervisor_and_the_server_together_loses_nothing_and_doubles_nothing(
    box: Box,
) -> None:
    """One GPU, three jobs: SIGKILL the supervisor and the server while the first runs and
    the others queue; restart the server, and let the next submit start a supervisor. Every
    job runs exactly once, one at a time (the runs file shows each start and end, never two
    jobs between one start and its end)."""
    names = ["a", "b", "c"]
    ids = [box.hwpool("submit", "--name", name, "--", sys.executable, "-c", RUN_ONCE, name,
                      str(box.work)).stdout.strip() for name in names]  # fmt: skip
    box.running(ids[0])
    box.wait_file("runs")
    supervisor = box.supervisor_pid()
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    box.server.kill()
    wait_gone(supervisor)
    box.server = Server(box.server.socket, "--gpus", "1").ready()
    last = box.hwpool("submit", "--name", "d", "--", sys.executable, "-c", RUN_ONCE, "d",
                      str(box.work)).stdout.strip()  # fmt: skip
    for name, job_id in zip([*names, "d"], [*ids, last], strict=True):
        box.running(job_id)
        box.file(f"{name}.go").touch()
        assert box.finished(job_id).state is JobState.SUCCEEDED, box.supervisor_log()
    runs = box.file("runs").read_text().split()
    assert runs == [word for name in ["a", "b", "c", "d"] for word in ("start", name, "end", name)]


def test_a_request_the_server_can_no_longer_grant_cancels_the_job_with_why(
    make_box: Callable[..., Box],
) -> None:
    """``--gpus 2`` is refused at submit on a one-GPU server (tests/submit/
    test_submit_server.py); here the server had two GPUs at submit and has one when the
    supervisor asks (restarted smaller while the job waited on a dependency): the job is
    cancelled with the server's answer as its reason, never run."""
    box = make_box("--gpus", "2")
    first = box.submit("--gpus", "0.5", job=["a", "wait=a.go"])
    second = box.submit("--gpus", "2", "--after", first, job=["b"])
    box.running(first)
    box.server.kill()
    box.server = Server(box.server.socket, "--gpus", "1").ready()
    box.file("a.go").touch()
    assert box.finished(first).exit_code == 0, box.supervisor_log()
    job = box.finished(second)
    assert job.state is JobState.CANCELLED
    assert job.reason is not None and job.reason.startswith("the server refused its request")
    assert not box.file("b.started").exists()


# ---------------------------------------------------------------- the commands on real jobs
@pytest.mark.parametrize(
    ("options", "command", "status"),
    [
        ((), ["true"], 0),
        ((), [sys.executable, "-c", "raise SystemExit(3)"], 3),
        (
            (),
            [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
            137,
        ),
        (("--time", "1"), ["sleep", "30"], 124),
    ],
)
def test_wait_exits_with_the_status_of_the_real_job(
    box: Box, options: tuple[str, ...], command: list[str], status: int
) -> None:
    job_id = box.hwpool("submit", *options, "--", *command).stdout.strip()
    done = box.hwpool("wait", job_id)
    assert done.returncode == status, (done.stderr, box.supervisor_log())


def test_wait_chains_work_in_a_script(box: Box) -> None:
    """The issue's use: a script submits, waits, and goes on only if the job succeeded."""
    script = (
        "set -e; id=$(hwpool submit -- sh -c 'echo built > artefact'); hwpool wait $id; "
        "id=$(hwpool submit -- sh -c 'cat artefact > used; exit 4'); hwpool wait $id || "
        "echo second=$? > outcome"
    )
    env = {**box.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    shim = box.root / "bin"
    shim.mkdir()
    (shim / "hwpool").write_text(f'#!/bin/sh\nexec {sys.executable} -m hwpool "$@"\n')
    (shim / "hwpool").chmod(0o755)
    env["PATH"] = f"{shim}:{env['PATH']}"
    done = subprocess.run(["sh", "-c", script], env=env, cwd=box.work, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert box.file("used").read_text() == "built\n"
    assert box.file("outcome").read_text() == "second=4\n"


FOLLOWED = """
import os, sys, time
folder = sys.argv[1]
for n in range(3):
    print(f"line {n}", flush=True)
    while not os.path.exists(os.path.join(folder, f"next{n}")):
        time.sleep(0.02)
"""


def test_logs_follow_shows_each_line_of_the_real_job_as_it_is_written(box: Box) -> None:
    job_id = box.hwpool("submit", "--", sys.executable, "-c", FOLLOWED, str(box.work)).stdout
    job_id = job_id.strip()
    box.running(job_id)
    follower = subprocess.Popen(
        [sys.executable, "-m", "hwpool", "logs", "-f", job_id], env=box.env,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert follower.stdout is not None
        for n in range(3):
            assert follower.stdout.readline() == f"line {n}\n"  # before the next is written
            box.file(f"next{n}").touch()
        assert follower.wait(60) == 0  # it ends with the job
        assert follower.stdout.read() == ""
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert box.job(job_id).state is JobState.SUCCEEDED


def test_hwpool_cancel_of_a_real_running_job_records_it_cancelled(box: Box) -> None:
    job_id = box.submit(job=["a", "wait=never"])
    box.running(job_id)
    box.wait_file("a.started")
    done = box.hwpool("cancel", job_id)
    assert done.returncode == 0, done.stderr
    job = box.job(job_id)
    assert (job.state, job.signal) == (JobState.CANCELLED, signal.SIGTERM)
    assert status_of(box.server.socket)["leases"] == []
    assert "was cancelled" in Path(job.stderr_log or "").read_text()


def test_the_in_process_api_submits_waits_and_reads_logs(box: Box) -> None:
    """``hwpool.submit`` in a real process of this user (the table and environment are
    taken from HWPOOL_STATE_DIR and the process's own)."""
    code = (
        "import hwpool, sys\n"
        "job = hwpool.submit([sys.executable, '-c', 'print(6 * 7)'], gpus=0.5, time='1m')\n"
        "record = job.wait(60)\n"
        "print(job.id, record.state.value, job.logs().strip())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=box.env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id, state, output = done.stdout.split()
    assert (state, output) == ("succeeded", "42")
    assert box.job(job_id).time_limit == 60


def test_from_a_file_queues_every_line_as_a_job_at_once(box: Box) -> None:
    listing = box.root / "experiments.txt"
    listing.write_text(
        "# three runs\n"
        f"{sys.executable} -c 'print(1)'\n\n"
        f"{sys.executable} -c 'print(\"two words\")'\n"
        f"{sys.executable} -c 'raise SystemExit(5)'\n"
    )
    done = box.hwpool("submit", "--gpus", "0.5", "--from", str(listing))
    assert done.returncode == 0, done.stderr
    ids = done.stdout.split()
    assert ids == ["j1", "j2", "j3"]
    ended = [box.finished(job_id) for job_id in ids]
    assert [job.state for job in ended] == [JobState.SUCCEEDED, JobState.SUCCEEDED,
                                            JobState.FAILED]  # fmt: skip
    assert [Path(job.stdout_log or "").read_text() for job in ended[:2]] == ["1\n", "two words\n"]
    assert all(job.gpus == Fraction(1, 2) for job in ended)


@pytest.mark.parametrize(
    ("lines", "options", "message"),
    [
        ("true\necho 'unclosed\n", (), "line 2"),
        ("true\nno-such-command-hwpool\n", (), "command 2"),
        ("# nothing\n\n", (), "no command"),
        ("true\n", ("--name", "x"), "--name"),
        ("true\n", ("--", "true"), "no -- CMD"),
    ],
)
def test_from_a_bad_file_queues_none_of_it(
    box: Box, lines: str, options: tuple[str, ...], message: str
) -> None:
    listing = box.root / "experiments.txt"
    listing.write_text(lines)
    done = box.hwpool("submit", "--from", str(listing), *options)
    assert done.returncode == (127 if "no-such-command" in lines else 2)  # not found: 127
    assert message in done.stderr, done.stderr
    if (box.state / "jobs.db").exists():
        with JobStore.open(box.state) as store:
            assert store.list(include_finished=True) == []
