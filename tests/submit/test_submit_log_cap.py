"""A job's logs are capped (``HWPOOL_JOBS_LOG_MAX``), with a marker where output was dropped;
the job never blocks on its output for it. Real ``hwpool submit``, supervisor, launcher and
job, on a real server (tests/jobbox.py)."""

from __future__ import annotations

import subprocess
import sys

from hostserver import BOUND
from hwpool._jobs._model import JobState
from jobbox import Box

MIB = 1 << 20
WRITER = (
    "import sys\n"
    "sys.stdout.buffer.write(b'a' * (3 << 20))\n"  # 3 MiB, past a 1 MiB cap
    "sys.stdout.flush()\n"
    "sys.stderr.write('a line on stderr\\n')\n"
)


def test_a_log_is_capped_with_markers_and_the_job_runs_to_its_end(box: Box) -> None:
    box.env["HWPOOL_JOBS_LOG_MAX"] = "1M"
    done = box.hwpool("submit", "--", sys.executable, "-c", WRITER)
    assert done.returncode == 0, done.stderr
    job = box.finished(done.stdout.strip())
    assert (job.state, job.exit_code) == (JobState.SUCCEEDED, 0), job

    assert job.stdout_log is not None and job.stderr_log is not None
    with open(job.stdout_log, "rb") as file:
        out = file.read()
    assert out[:MIB] == b"a" * MIB  # the first MiB, as written
    markers = out[MIB:].decode()
    lines = [line for line in markers.split("\n") if line]
    assert all(line.startswith("[hwpool: ") for line in lines), markers[:200]  # no job bytes
    assert "[hwpool: this log reached its cap of 1M: the rest of the job's stdout is " \
           "dropped]" in markers  # fmt: skip
    assert f"[hwpool: {2 * MIB} bytes of the job's stdout were dropped in all]" in markers
    assert len(out) < MIB + 1024
    with open(job.stderr_log, "rb") as file:
        err = file.read()
    assert b"a line on stderr\n" in err and b"dropped" not in err


def test_a_malformed_cap_is_refused_before_anything_is_queued(box: Box) -> None:
    box.env["HWPOOL_JOBS_LOG_MAX"] = "12"
    done = box.hwpool("submit", "--", "true")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "HWPOOL_JOBS_LOG_MAX" in done.stderr and "'12'" in done.stderr
    assert "Traceback" not in done.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "hwpool", "jobs", "--all", "--json"], env={**box.env,
        "HWPOOL_JOBS_LOG_MAX": ""}, capture_output=True, text=True, timeout=BOUND, check=False,
    )  # fmt: skip
    assert listed.stdout.strip() in ("[]", ""), listed
