"""Which processes hwpool may signal (``_watch/_proof.py``) and how it signals one
(``_host/_signal.py``): over real processes, a pid reused by another process included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from hwpool._host._procs import ProcessId, ProcFS, identify, is_process, process_start
from hwpool._host._signal import signal_process
from hwpool._watch._proof import JobGroup, has_job, job_group
from pidwrap import need_pid_wrap, popen_at_pid

# A holder as ``hwpool run`` is one: it starts its job as a child leading a group of its own,
# prints the job's pid, and waits until its stdin closes.
_HOLDER = """
import subprocess, sys
job = subprocess.Popen(["sleep", "60"], process_group=0)
print(job.pid, flush=True)
sys.stdin.read()
job.kill()
job.wait()
"""

BOUND = 10.0


@pytest.fixture
def holder() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A holder process and its job's pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    job = int(proc.stdout.readline())
    yield proc, job
    proc.stdin.close()
    proc.wait(BOUND)


def test_a_process_is_named_by_its_pid_start_time_and_uid() -> None:
    me = identify(os.getpid())
    assert me == ProcessId(os.getpid(), process_start(os.getpid()) or -1, os.getuid())
    assert is_process(me) and not is_process(ProcessId(me.pid, me.start + 1, me.uid))
    assert identify(0) is None and identify(-1) is None


def test_the_job_group_of_a_holder_is_proven(
    holder: tuple[subprocess.Popen[str], int],
) -> None:
    proc, job = holder
    procs = ProcFS()
    me = identify(proc.pid)
    found = job_group(me, job, procs)
    assert isinstance(found, JobGroup) and found.pgid == job
    assert [m.pid for m in found.members] == [job]
    assert has_job(me, procs)


def test_a_holder_that_uses_the_gpu_itself_or_has_ended_is_not_proven(
    holder: tuple[subprocess.Popen[str], int],
) -> None:
    proc, job = holder
    procs = ProcFS()
    me = identify(proc.pid)
    assert me is not None
    assert "uses the GPU itself" in str(job_group(me, proc.pid, procs))
    assert "does not descend" in str(job_group(me, os.getpid(), procs))
    assert "start time could not be read" in str(job_group(None, job, procs))
    gone = ProcessId(me.pid, me.start + 1, me.uid)  # as if the pid named another process now
    assert "has ended" in str(job_group(gone, job, procs))
    assert not has_job(gone, procs)


def test_a_group_its_holder_shares_is_not_proven() -> None:
    """A holder's child that stays in its parent's group (a shell's, say) leads none."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.replace("process_group=0", "process_group=None")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        job = int(proc.stdout.readline())
        found = job_group(identify(proc.pid), job, ProcFS())
        assert "does not lead a process group of its own" in str(found)
        assert not has_job(identify(proc.pid), ProcFS())
    finally:
        proc.stdin.close()
        proc.wait(BOUND)


def test_a_signal_reaches_the_process_recorded_and_never_a_later_holder_of_its_pid() -> None:
    need_pid_wrap()
    first = subprocess.Popen(["sleep", "60"])
    recorded = identify(first.pid)
    assert recorded is not None
    first.kill()
    first.wait(BOUND)
    assert not signal_process(recorded, signal.SIGTERM)  # gone: nothing sent
    script = "import signal, time; signal.signal(signal.SIGTERM, lambda *_: print('TERM')); "
    script += "print('ready', flush=True); time.sleep(60)"
    later = popen_at_pid(
        recorded.pid, [sys.executable, "-c", script], after=recorded.start,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert later.stdout is not None and later.stdout.readline() == "ready\n"
        assert not signal_process(recorded, signal.SIGTERM)  # the same pid, another process
        now = identify(later.pid)
        assert now is not None and signal_process(now, signal.SIGKILL)
        later.wait(BOUND)
        assert later.returncode == -signal.SIGKILL
        assert "TERM" not in later.stdout.read()
    finally:
        if later.poll() is None:
            later.kill()
            later.wait(BOUND)
