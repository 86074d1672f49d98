"""``hwpool run`` when the server stops, hangs or restarts, and when it is started without a
terminal's usual furniture (``2>&-``, ``nohup``, a shell's ``&``).

Real ``hwpool run`` processes over real servers; a restarting server is a socket that accepts
and closes (tests/notaserver.py), whose count of attempts proves that the client kept trying.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hostserver import BOUND, ENV, Server, run_cli, status_of
from interactive import interactive
from notaserver import NotAServer
from runproc import Run, eventually, gone

StartServer = Callable[..., Server]
ATTEMPTS = 10  # attempts to reach the server: past the backoff's longest pause, several times
SERVER_ARGS = ("--gpus", "1", "--grace", "8")


def ignored(pid: int) -> set[int]:
    """The signals process ``pid`` ignores (SigIgn in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    raise AssertionError(f"no SigIgn line for pid {pid}")


# ----------------------------------------------------------------- the server goes away (18)
def test_a_job_runs_on_while_its_server_is_stopped_and_keeps_its_lease(
    start_server: StartServer, sockdir: Path
) -> None:
    server = start_server(*SERVER_ARGS)
    run = Run(server, sockdir, "a", "wait=a.go")
    job = run.started()["pid"]
    (lease,) = status_of(server.socket)["leases"]
    assert server.stop(signal.SIGTERM) == 0  # a planned stop: an upgrade, systemctl stop
    with NotAServer(server.socket) as away:
        away.wait_for(ATTEMPTS)
    assert run.proc.poll() is None and not gone(job)  # the job runs on meanwhile
    again = start_server(*SERVER_ARGS)
    again.wait_for(f"reclaim #{lease['id']} by root (uid 0) pid {run.pid}")
    assert [x["id"] for x in status_of(again.socket)["leases"]] == [lease["id"]]
    (sockdir / "a.go").write_text("")
    code, err = run.finish()
    assert code == 0, err
    assert "ending the job" not in err


@pytest.mark.parametrize(
    ("options", "env"),
    [(("--reconnect-timeout", "0.2"), {}), ((), {"HWPOOL_RECONNECT_TIMEOUT": "0.2"})],
)
def test_a_job_ends_once_its_server_stays_away_past_the_configured_bound(
    start_server: StartServer, sockdir: Path, options: tuple[str, ...], env: dict[str, str]
) -> None:
    server = start_server(*SERVER_ARGS)
    run = Run(server, sockdir, "a", "wait=a.go", options=options, env={**ENV, **env})
    job = run.started()["pid"]
    assert server.stop(signal.SIGTERM) == 0
    code, err = run.finish()
    assert code == 128 + signal.SIGTERM and gone(job)
    assert "the lease is no longer held" in err and "ending the job" in err


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        (("--reconnect-timeout", "-1"), {}, "--reconnect-timeout"),
        (("--reconnect-timeout", "inf"), {}, "--reconnect-timeout"),
        ((), {"HWPOOL_RECONNECT_TIMEOUT": "soon"}, "HWPOOL_RECONNECT_TIMEOUT"),
        ((), {"HWPOOL_RECONNECT_TIMEOUT": "-2"}, "HWPOOL_RECONNECT_TIMEOUT"),
    ],
)
def test_a_bad_reconnect_bound_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], env: dict[str, str], fragment: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run_cli("run", "--no-start", *args, "--", "true")
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("hwpool: error: ") and fragment in err


# ----------------------------------------------------------------- a stopped server (13)
def test_timeout_against_a_stopped_server_exits_124(
    start_server: StartServer, sockdir: Path
) -> None:
    server = start_server(*SERVER_ARGS)
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        run = Run(server, sockdir, "a", options=("--timeout", "1"))
        code, err = run.finish()
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert code == 124, err
    assert "--timeout 1 s" in err and len(err.strip().splitlines()) == 1
    assert not (sockdir / "a.started").exists()


# ----------------------------------------------------------------- the terminal (20)
def test_a_closed_stderr_is_no_terminal(start_server: StartServer, sockdir: Path) -> None:
    server = start_server(*SERVER_ARGS)
    run = Run(server, sockdir, "a", launcher=("sh", "-c", 'exec "$@" 2>&-', "sh"))
    code, err = run.finish()
    assert (code, err) == (0, "")
    assert (sockdir / "a.done").exists()


IGNORING = (  # runs its arguments with signal N ignored, as nohup (SIGHUP) or `&` (SIGINT) do
    "import os, signal, sys; signal.signal(int(sys.argv[1]), signal.SIG_IGN); "
    "os.execvp(sys.argv[2], sys.argv[2:])"
)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_ignored_at_the_start_stays_ignored_by_run_and_job(
    start_server: StartServer, sockdir: Path, signum: int
) -> None:
    server = start_server(*SERVER_ARGS)
    launcher = (sys.executable, "-c", IGNORING, str(int(signum)))
    run = Run(server, sockdir, "a", "wait=a.go", launcher=launcher)
    job = run.started()["pid"]
    assert signum in ignored(run.pid)
    assert signum in ignored(job)
    run.proc.send_signal(signum)  # the terminal hangs up, say: nothing happens
    (sockdir / "a.go").write_text("")
    eventually((sockdir / "a.done").exists, "the job finishes", run)
    code, err = run.finish()
    assert code == 0, err


# ----------------------------------------------------------------- Ctrl-C while the job runs (21)
FORWARDER = """\
import os, signal, sys, threading
from hwpool._cli._child import run_job

threading.Thread(target=threading.Event().wait, daemon=True).start()  # takes the signals
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
JOB = "import signal, time; signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); " \\
    "print('started', flush=True); time.sleep(60)"  # (the mask is inherited: unblock it)
sys.exit(run_job([sys.executable, "-c", JOB], os.environ, 1.0))
"""


def test_ctrl_c_that_lands_as_run_sleeps_is_still_forwarded_to_the_job() -> None:
    # As in the client's waits (tests/server/test_client_outages.py): a signal another thread
    # takes is acted on only once the main thread wakes, which waiting for the job did not.
    proc = subprocess.Popen(  # interactive: the SIGINT below must reach it under nohup too
        interactive([sys.executable, "-c", FORWARDER]), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert select.select([proc.stdout], [], [], BOUND)[0], "the job never started"
        assert proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=BOUND)
    finally:
        if proc.poll() is None:  # the job was never told: end both, the assertion says so
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 128 + signal.SIGINT, err
