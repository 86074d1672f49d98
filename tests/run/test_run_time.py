"""``hwpool run --time LIMIT``: a real server, real ``hwpool run`` processes, real jobs.

A job that runs past its limit gets SIGTERM (its process group), SIGKILL ``--grace`` s later,
and ``hwpool run`` exits 124 saying it timed out; the request carries the limit (plus the
grace) as ``limit_s``, which the server enforces too. Every wait is bounded (``Run.finish``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hostserver import BOUND, ENV, Server, run_cli, status_of
from runproc import Run, eventually, gone

StartServer = Callable[..., Server]

STUBBORN = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(60)
"""


@pytest.fixture
def one_gpu(start_server: StartServer) -> Server:
    return start_server("--gpus", "1")


def test_a_job_past_its_time_is_ended_and_run_exits_124(one_gpu: Server, sockdir: Path) -> None:
    run = Run(one_gpu, sockdir, "a", "sleep", options=("--time", "1", "--grace", "5"))
    job = run.started()["pid"]
    code, err = run.finish()
    assert code == 124, err
    assert gone(job)
    lines = err.strip().splitlines()
    assert lines[0].endswith("for at most 1 s (--time)")
    assert lines[1:] == [
        "hwpool run: timed out: the job ran past --time 1 s; ending it (SIGTERM, then SIGKILL "
        "after 5 s); exit status 124"
    ]
    eventually(lambda: status_of(one_gpu.socket)["leases"] == [], "the lease is free")


def test_with_no_grace_the_servers_revocation_is_a_time_out_too(
    one_gpu: Server, sockdir: Path
) -> None:
    """``--grace 0``: the server's limit is --time itself, so its ``revoked`` (reason limit)
    may come a moment before hwpool run's own deadline: the job is timed out all the same,
    never "lost"."""
    run = Run(one_gpu, sockdir, "a", "sleep", options=("--time", "0.5", "--grace", "0"))
    code, err = run.finish()
    assert code == 124, err
    assert "timed out" in err and "no longer held" not in err
    eventually(lambda: status_of(one_gpu.socket)["leases"] == [], "the lease is free")


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(
    one_gpu: Server, sockdir: Path
) -> None:
    marker = sockdir / "stubborn.pid"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwpool", "run", "--socket", str(one_gpu.socket),
         "--time", "0.5", "--grace", "0.5", "--", sys.executable, "-c", STUBBORN, str(marker)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=BOUND)
    assert proc.returncode == 124, err
    assert "timed out: the job ran past --time 0.5 s" in err
    assert gone(int(marker.read_text()))  # SIGKILLed: it ignored SIGTERM


def test_a_job_that_ends_in_time_keeps_its_own_status(one_gpu: Server, sockdir: Path) -> None:
    run = Run(one_gpu, sockdir, "a", "exit=3", options=("--time", "30m"))
    code, err = run.finish()
    assert code == 3, err
    assert "for at most 30 min (--time)" in err and "timed out" not in err


def test_the_limit_and_the_grace_reach_the_server(one_gpu: Server, sockdir: Path) -> None:
    """The server journals the lease's limit end: --time plus --grace after its grant."""
    run = Run(one_gpu, sockdir, "a", "wait=a.go", options=("--time", "2h", "--grace", "7"))
    run.started()
    journal = one_gpu.socket.with_name(one_gpu.socket.name + ".journal").read_text()
    (sockdir / "a.go").touch()
    assert run.finish()[0] == 0
    # The value is on the server's monotonic clock: only that the lease has one is portable.
    assert any('"op":"granted"' in line and '"limit_end":' in line for line in journal.split())


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("0", "must be a duration > 0, got '0'"),
        ("0s", "got '0s'"),
        ("abc", "got 'abc'"),
        ("-5", "got '-5'"),
        ("nan", "got 'nan'"),
        ("1x", "got '1x'"),
        ("", "got ''"),
    ],
)
def test_a_bad_time_is_one_line_naming_it_and_exits_2(value: str, fragment: str) -> None:
    code, out, err = run_cli("run", "--time", value, "--", "true")
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("hwpool: error: run: ") and fragment in err
    # --time itself (before it existed, argparse read it as an abbreviation of --timeout)
    assert "--time:" in err and "--timeout" not in err


def test_help_shows_time() -> None:
    code, out, _ = run_cli("run", "--help")
    assert code == 0 and "--time LIMIT" in out
