"""Holds and dependency kinds end to end: real ``hwpool submit``/``hold``/``release``
processes, the real supervisor and launchers, a real one-GPU server, real jobs
(tests/run/job.py). Orderings are proven by the files the jobs see when they start."""

from __future__ import annotations

import json
import time

from hostserver import status_of
from hwpool._jobs._model import JobState
from jobbox import LONG_BOUND, Box


def seen_at_start(box: Box, name: str) -> list[str]:
    """The files of the work folder that existed when job ``name`` started."""
    files: list[str] = json.loads(box.file(f"{name}.started").read_text())["files"]
    return files


def waiting_at_server(box: Box, expected: list[str] | None = None) -> list[str]:
    """The jobs whose requests wait in the server's queue, in its order, once they are
    ``expected`` (bounded: the supervisor asks for them when it next looks), or once any is."""
    deadline = time.monotonic() + LONG_BOUND
    while True:
        names = [w["name"].split()[0] for w in status_of(box.server.socket)["waiting"]]
        if (names == expected if expected is not None else names) or time.monotonic() > deadline:
            return names
        time.sleep(0.05)  # the server's status is the only view a test has of its queue


def test_a_released_job_runs_in_its_place_before_later_ones(box: Box) -> None:
    a = box.submit(job=["a", "wait=a.go"])
    box.running(a)
    b = box.submit("--hold", job=["b", "wait=b.go"])
    c = box.submit(job=["c"])
    assert box.job(b).held_by is not None and box.job(b).state is JobState.QUEUED
    assert waiting_at_server(box) == [c]
    released = box.hwpool("release", b)
    assert (released.returncode, released.stdout) == (0, f"{b}: released\n"), released.stderr
    assert waiting_at_server(box, [b, c]) == [b, c]  # c withdrawn and asked for again behind b
    box.file("a.go").touch()
    box.running(b)  # b, submitted before c, starts first although it was asked for again
    assert box.job(c).state is JobState.QUEUED
    box.file("b.go").touch()
    assert box.finished(c).state is JobState.SUCCEEDED
    assert "b.done" in seen_at_start(box, "c")


def test_a_held_job_is_never_started_while_held(box: Box) -> None:
    held = box.submit("--hold", job=["held"])
    after = box.submit(job=["after"])
    assert box.finished(after).state is JobState.SUCCEEDED  # the GPU was free meanwhile
    assert box.job(held).state is JobState.QUEUED and not box.file("held.started").exists()
    listed = box.hwpool("jobs", "--state", "held", "--json")
    assert [job["id"] for job in json.loads(listed.stdout)] == [held]
    assert json.loads(listed.stdout)[0]["state"] == "held"
    assert box.hwpool("hold", held).returncode == 0  # holding it again is no error
    box.hwpool("release", held)
    assert box.finished(held).state is JobState.SUCCEEDED


def test_holding_a_running_job_is_refused_and_holds_none(box: Box) -> None:
    a = box.submit(job=["a", "wait=a.go"])
    b = box.submit(job=["b"])
    box.running(a)
    done = box.hwpool("hold", b, a)
    assert done.returncode == 2 and done.stdout == ""
    assert f"{a} is running: only a queued job" in done.stderr and "nothing was held" in done.stderr
    assert box.job(b).held_by is None
    box.file("a.go").touch()
    assert box.finished(b).state is JobState.SUCCEEDED


def test_after_notok_runs_the_clean_up_only_when_the_job_fails(box: Box) -> None:
    bad = box.submit(job=["bad", "wait=go", "exit=3"])
    good = box.submit(job=["good", "wait=go"])
    on_bad = box.submit("--after-notok", bad, job=["on_bad"])
    on_good = box.submit("--after-notok", good, job=["on_good"])
    anyway = box.submit("--after-any", f"{bad},{good}", job=["anyway"])
    box.file("go").touch()
    assert box.finished(on_bad).state is JobState.SUCCEEDED
    assert box.finished(anyway).state is JobState.SUCCEEDED
    cancelled = box.finished(on_good)
    assert (cancelled.state, cancelled.reason) == (
        JobState.CANCELLED, f"dependency {good} succeeded (--after-notok needs one to fail)",
    )  # fmt: skip
    waited = box.hwpool("wait", on_good)
    assert (
        waited.returncode != 0 and f"dependency {good} succeeded" in waited.stdout + waited.stderr
    )


def test_update_edits_a_queued_job_and_its_request_is_asked_again(box: Box) -> None:
    a = box.submit(job=["a", "wait=a.go"])
    box.running(a)
    b = box.submit("--gpus", "1", job=["b"])
    assert waiting_at_server(box) == [b]
    done = box.hwpool("update", b, "--gpus", "0.5", "--priority", "3", "--name", "renamed")
    assert (done.returncode, done.stdout) == (0, f"{b}: updated --name, --priority, --gpus\n")
    deadline = time.monotonic() + LONG_BOUND
    while True:  # the supervisor withdraws the old request and asks for the new share
        waiting = status_of(box.server.socket)["waiting"]
        if [w["name"] for w in waiting] == [f"{b} renamed"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [w["name"] for w in waiting] == [f"{b} renamed"]
    box.file("a.go").touch()
    job = box.finished(b)
    assert (job.state, job.id, job.gpus, job.priority) == (JobState.SUCCEEDED, b, 0.5, 3)
    refused = box.hwpool("update", b, "--priority", "1")
    assert refused.returncode == 2 and f"'{b}' is succeeded" in refused.stderr


def test_update_of_a_running_job_is_refused_naming_the_fields(box: Box) -> None:
    a = box.submit(job=["a", "wait=a.go"])
    box.running(a)
    done = box.hwpool("update", a, "--priority", "2", "--time", "1h")
    assert done.returncode == 2 and f"{a} is running: its --priority, --time cannot" in done.stderr
    assert box.job(a).priority == 0
    box.file("a.go").touch()
    box.finished(a)
