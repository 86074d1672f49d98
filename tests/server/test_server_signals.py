"""What a root server signals, and when a revoked lease's GPU is free: real servers, real
processes, real Unix users.

- A lease's client whose pid the kernel gave to another user's process after it ended: that
  process is not the lease's, and the over-lease ``term`` never signals it.
- A client that shares a process group and session with a root shell (``su`` without a new
  session) and uses the GPU itself: its group, the shell's, is never signalled.
- A revoked lease's GPU is not granted to the next waiter while the job still runs in its
  SIGTERM grace; it is once the job (and its ``hwpool run``) are gone.

Every wait is on the server's log, ``hwpool status --json`` or a file a process writes,
bounded.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakemachine import Machine

from hostserver import BOUND, CLIENT, ENV, ClientProc, Server, _readline, run_cli, status_of
from hwpool._core._capacity import UNITS_PER_GPU
from pidwrap import boot_tick, need_pid_wrap, popen_at_pid
from rawpeers import Peer, acquire, connect_as, hello
from runproc import Run, eventually
from users import Users

# Another user's process: says when it runs, and says so if it ever gets SIGTERM (and lives on).
_VICTIM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: print("got SIGTERM", flush=True))
print("ready", flush=True)
time.sleep(60)
"""

# A root "shell": leads its own session and group, says if it gets SIGTERM, and runs a client
# (tests/server/client_proc.py) in that same group and session, on its own stdin and stdout.
_SHELL = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: print("shell got SIGTERM", file=sys.stderr, flush=True))
client = subprocess.Popen([sys.executable, *sys.argv[1:]])
print(client.pid, flush=True)
client.wait()
"""


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes the test starts, killed at its end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=BOUND)


def test_a_reused_pid_of_another_user_is_never_signalled(
    machine: Machine, users: Users, procs: list[subprocess.Popen[str]]
) -> None:
    """The lease's client connected from a process that ended (a forking client); the kernel
    gave its pid to another user's process, which now uses the GPU: not the lease's, never
    counted against it, never signalled, and the log says the holder is not proven."""
    need_pid_wrap()
    server = machine.start("--over-lease", "term", "--over-lease-grace", "0", memory=False)
    sock = connect_as(0, 0, machine.socket)  # its connecting process has ended, reaped
    started = boot_tick()  # it started before this
    peer = Peer(sock)
    try:
        peer.send(hello(), acquire(1, 1, UNITS_PER_GPU // 4))
        assert peer.answer(1)["op"] == "granted"
        dead = status_of(machine.socket)["leases"][0]["pid"]
        other = users.user()
        argv = users.argv(other, [users.python(other), "-c", _VICTIM])
        victim = popen_at_pid(
            dead, argv, after=started, stdout=subprocess.PIPE, text=True,
            start_new_session=True, env=users.env(),
        )  # fmt: skip
        procs.append(victim)
        assert _readline(victim, BOUND) == "ready"
        mark = len(server.lines)
        machine.set({dead: 5000})  # over the lease's 4096 MiB, if it were the lease's
        server.wait_for("used outside the queue", mark)  # sampled, and not the lease's
        assert "not proven" in "\n".join(server.lines)
        assert victim.poll() is None
    finally:
        peer.close()
    victim.kill()
    out, _ = victim.communicate(timeout=BOUND)
    assert "got SIGTERM" not in out


def test_a_client_in_a_root_shells_group_never_gets_the_group_signalled(
    machine: Machine, procs: list[subprocess.Popen[str]]
) -> None:
    """A plain client (not a job) that does not lead its process group or session, over its
    lease under ``term``: warned only (the lease is not ended), the shell's group never
    signalled, and the log says why."""
    server = machine.start("--over-lease", "term", "--over-lease-grace", "0")
    shell = subprocess.Popen(
        [sys.executable, "-c", _SHELL, CLIENT, str(machine.socket)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV, start_new_session=True,
    )  # fmt: skip
    procs.append(shell)
    client = int(_readline(shell, BOUND))
    assert _readline(shell, BOUND) == "ready"
    assert shell.stdin is not None
    shell.stdin.write("mem a 2048\n")
    shell.stdin.flush()
    assert _readline(shell, BOUND).startswith("granted a")
    machine.set({client: 5000})
    line = server.wait_for("stayed over its memory")
    assert "nothing is signalled (warn only)" in line and "uses the GPU itself" in line, line
    assert status_of(machine.socket)["leases"], "not ended: warn only"
    assert shell.poll() is None
    shell.kill()
    _, err = shell.communicate(timeout=BOUND)
    assert "shell got SIGTERM" not in err


def test_a_revoked_leases_gpu_waits_until_its_job_is_gone(
    start_server: object, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """``hwpool cancel`` revokes a lease whose job handles SIGTERM and goes on (its grace):
    the waiter is granted only once the job has exited and its ``hwpool run`` with it."""
    assert callable(start_server)
    server: Server = start_server("--gpus", "1")
    holder = Run(server, tmp_path, "holder", "trap", "wait=go")
    waiter: ClientProc | None = None
    try:
        holder.started()
        waiter = ClientProc(server.socket)
        waiter.send("full w 1")
        eventually(lambda: len(status_of(server.socket)["waiting"]) == 1, "the waiter waits")
        lease = status_of(server.socket)["leases"][0]["id"]
        code, _, err = run_cli("cancel", str(lease), "--socket", str(server.socket))
        assert code == 0, err
        eventually((tmp_path / "holder.term").exists, "the job got SIGTERM", holder)
        status = status_of(server.socket)
        assert [w["pid"] for w in status["waiting"]] == [waiter.pid], status  # not granted
        assert status["leases"] == [], status
        (tmp_path / "go").touch()
        holder.finish()
        waiter.expect("granted w")
    finally:
        (tmp_path / "go").touch()
        holder.kill()
        if waiter is not None:
            waiter.kill()
