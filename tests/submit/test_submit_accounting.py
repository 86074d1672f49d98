"""A finished job's accounting, end to end: the real launcher's ``getrusage`` of the job's
process tree, the GPUs its lease held, who cancelled it."""

from __future__ import annotations

import getpass
import json
import sys

import pytest

from hwpool._jobs._model import JobState
from jobbox import Box

HUNGRY = (
    "import time; block = bytearray(64 * 2**20); block[::4096] = b'x' * len(block[::4096]); "
    "end = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
)


def test_the_record_has_what_the_job_used(box: Box) -> None:
    done = box.hwpool("submit", "--gpus", "0.5", "--", sys.executable, "-c", HUNGRY)
    assert done.returncode == 0, done.stderr
    job = box.finished(done.stdout.strip())
    assert job.state is JobState.SUCCEEDED and job.usage is not None
    assert job.usage.cpu_user_s + job.usage.cpu_system_s >= 0.3
    assert job.usage.max_rss_kib >= 64 * 1024  # the block, touched page by page
    assert (job.gpu_share, job.ended_by) == (0.5, None)
    (shown,) = json.loads(box.hwpool("jobs", "--json").stdout)
    assert job.started_at is not None and job.ended_at is not None
    assert shown["gpu_seconds"] == pytest.approx(0.5 * (job.ended_at - job.started_at))
    assert shown["max_rss_kib"] == job.usage.max_rss_kib and shown["peak_gpu_memory_mib"] is None


def test_who_cancelled_a_job_is_recorded(box: Box) -> None:
    running = box.submit(job=["a", "wait=a.go"])
    queued = box.submit(job=["b"])
    box.running(running)
    done = box.hwpool("cancel", queued, running)
    assert done.returncode == 0, done.stderr
    me = getpass.getuser()
    assert box.finished(queued).ended_by == me
    ended = box.finished(running)
    assert (ended.state, ended.ended_by) == (JobState.CANCELLED, me)
    assert ended.usage is not None  # the launcher still measured what it used
