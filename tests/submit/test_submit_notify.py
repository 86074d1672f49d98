"""``submit --notify CMD`` end to end: the real supervisor runs CMD once the job has ended,
with the job's variables and its JSON record; a failing or hanging one changes nothing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hwpool._jobs._model import JobState
from jobbox import Box

WRITE = "cat > notified.json; env > notified.env"


def env_of(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_the_notifier_runs_once_with_the_jobs_variables_and_record(box: Box) -> None:
    job_id = box.submit("--notify", WRITE, "--name", "train it", job=["a", "exit=3"])
    job = box.finished(job_id)
    assert (job.state, job.notify) == (JobState.FAILED, WRITE)
    env = env_of(box.wait_file("notified.env"))
    assert (env["HWPOOL_JOB_ID"], env["HWPOOL_JOB_NAME"]) == (job_id, "train it")
    assert (env["HWPOOL_JOB_STATE"], env["HWPOOL_JOB_EXIT"]) == ("failed", "3")
    record = json.loads(box.file("notified.json").read_text())
    assert (record["id"], record["state"], record["exit_code"]) == (job_id, "failed", 3)
    assert box.job(job_id) == job  # the record is the job's own, untouched


def test_a_job_cancelled_in_the_queue_notifies_too(box: Box) -> None:
    blocker = box.submit(job=["a", "wait=a.go"])
    box.running(blocker)
    queued = box.submit("--notify", WRITE, job=["b"])
    assert box.hwpool("cancel", queued).returncode == 0
    env = env_of(box.wait_file("notified.env"))
    assert (env["HWPOOL_JOB_ID"], env["HWPOOL_JOB_STATE"]) == (queued, "cancelled")
    box.file("a.go").touch()
    box.finished(blocker)


def test_a_hanging_or_failing_notifier_changes_no_record_and_holds_no_queue(box: Box) -> None:
    env = {**box.env, "HWPOOL_NOTIFY_TIMEOUT": "1s"}
    hang = box.hwpool(
        "submit", "--notify", "touch hung; exec sleep 60", "--", sys.executable, "-c", "pass",
        env=env,
    )  # fmt: skip
    fail = box.hwpool("submit", "--notify", "exit 7", "--", "true", env=env)
    assert hang.returncode == fail.returncode == 0, hang.stderr + fail.stderr
    assert box.finished(hang.stdout.strip()).state is JobState.SUCCEEDED
    assert box.finished(fail.stdout.strip()).state is JobState.SUCCEEDED
    box.wait_file("hung")
    after = box.submit(job=["after"])
    assert box.finished(after).state is JobState.SUCCEEDED
    killed = f"{hang.stdout.strip()}: its notify command ran past 1 s: killed"
    failed = f"{fail.stdout.strip()}: its notify command exited 7"
    box.until(
        after, lambda _: killed in box.supervisor_log() and failed in box.supervisor_log(),
        "logged both notifiers' ends",
    )  # fmt: skip


def test_the_users_default_notifier_and_an_unsafe_config(box: Box) -> None:
    config = box.root / "config" / "hwpool"
    config.mkdir(parents=True)
    (config / "config.toml").write_text('notify = "touch by-default"\n')
    env = {**box.env, "XDG_CONFIG_HOME": str(box.root / "config")}
    done = box.hwpool("submit", "--", "true", env=env)
    assert done.returncode == 0, done.stderr
    box.wait_file("by-default")
    none = box.hwpool("submit", "--notify", "", "--", "true", env=env)
    assert box.job(none.stdout.strip()).notify is None
    os.chmod(config / "config.toml", 0o666)
    refused = box.hwpool("submit", "--", "true", env=env)
    assert refused.returncode == 2 and "config.toml" in refused.stderr
    assert "writable by others" in refused.stderr
