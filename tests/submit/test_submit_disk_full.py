"""Jobs' records survive a full disk: a job that exits 0 while the state directory's disk is
full is recorded ``succeeded`` once space is freed (never ``running``, then ``lost``), and the
supervisor lives through the table's faults and runs the queue again by itself.

For real: the state directory is a 1 MiB tmpfs (root only; skipped elsewhere), filled by
the test, a real server, ``hwpool submit``, supervisor, launchers and jobs."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostserver import BOUND, status_of
from hwpool._jobs._model import JobState
from jobbox import LONG_BOUND, Box


@pytest.fixture
def small_box(make_box: Callable[..., Box], box_root: Path) -> Iterator[Box]:
    """A box whose state directory is a tmpfs of 1 MiB."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small filesystem")
    state = box_root / "state"
    state.mkdir(mode=0o700)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state)]
    if subprocess.run(mount, capture_output=True, timeout=BOUND, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        box = make_box()
        yield box
        box.kill_all()
    finally:
        subprocess.run(["umount", "-l", str(state)], timeout=BOUND, check=False)


def fill(path: Path) -> None:
    """Write ``path`` until its disk is full."""
    with path.open("wb", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def labelled(box: Box, job_id: str) -> dict[str, list[int]]:
    """The server's lease and waiter ids labelled ``job_id`` (``j1 NAME``)."""
    status = status_of(box.server.socket)
    return {
        kind: [r["id"] for r in status[kind] if (r.get("name") or "").split(" ")[0] == job_id]
        for kind in ("leases", "waiting")
    }


def until(what: str, check: Callable[[], bool], box: Box) -> None:
    deadline = time.monotonic() + LONG_BOUND
    while not check():
        assert time.monotonic() < deadline, f"never {what}\n{box.supervisor_log()}"
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_a_full_disk_leaves_true_records_and_the_queue_resumes_by_itself(small_box: Box) -> None:
    box = small_box
    first = box.submit(job=["a", "wait=go"])  # exits 0 once told
    second = box.submit(job=["b"])
    box.running(first)
    until("asked for the second job", lambda: bool(labelled(box, second)["waiting"]), box)
    asked = labelled(box, second)["waiting"]
    supervisor = box.supervisor_pid()

    fill(box.state / "fill")
    (box.work / "go").touch()  # the first job exits 0: its end cannot be written
    box.wait_file("a.done")
    until("gave the first job's lease back", lambda: not labelled(box, first)["leases"], box)
    assert box.job(first).state is JobState.RUNNING  # nothing could be written
    # The second job was granted, its launcher could not record it running: the supervisor
    # lives, and asks for it again by itself (a new request).
    until(
        "asked for the second job again",
        lambda: any(i not in asked for ids in labelled(box, second).values() for i in ids),
        box,
    )
    assert box.job(second).state is JobState.QUEUED

    (box.state / "fill").unlink()
    done = box.finished(first)
    assert (done.state, done.exit_code, done.reason) == (JobState.SUCCEEDED, 0, None)
    after = box.finished(second)
    assert (after.state, after.exit_code) == (JobState.SUCCEEDED, 0), after
    assert box.supervisor_pid() == supervisor
    with contextlib.suppress(ProcessLookupError):
        os.kill(supervisor or 0, 0)  # still alive: the same process ran the whole queue


def reaped(pid: int) -> bool:
    """Whether ``pid`` is gone, reaped by its parent (not a zombie)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.timeout(180)
def test_the_supervisor_lives_through_its_own_writes_failing(small_box: Box) -> None:
    box = small_box
    job_id = box.submit(job=["a", "sleep"])
    launcher = box.running(job_id).pid
    assert launcher is not None
    supervisor = box.supervisor_pid()

    fill(box.state / "fill")
    os.killpg(launcher, signal.SIGKILL)  # its launcher and job die: the supervisor must
    until("reaped the launcher", lambda: reaped(launcher), box)  # record it lost, and cannot
    assert box.job(job_id).state is JobState.RUNNING

    (box.state / "fill").unlink()
    lost = box.finished(job_id)
    assert lost.state is JobState.LOST and "recorded its end" in (lost.reason or "")
    assert box.supervisor_pid() == supervisor
    again = box.submit(job=["b"])  # the same supervisor runs the queue on
    assert box.finished(again).state is JobState.SUCCEEDED
    assert box.supervisor_pid() == supervisor
