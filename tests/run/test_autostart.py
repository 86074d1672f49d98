"""Autostart: ``hwpool run`` with no server on the per-user socket starts one, once.

The per-user socket is ``$XDG_RUNTIME_DIR/hwpool/hwpool.sock``; each test points
XDG_RUNTIME_DIR at a fresh directory and stops the server it started.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fakes.gpus import A100, RTX, smi_script
from hostserver import ENV, Server, status_of
from runproc import Run, eventually, gone

SOCKET = Path("hwpool") / "hwpool.sock"


@pytest.fixture
def user_env(sockdir: Path) -> Iterator[dict[str, str]]:
    """An environment whose per-user socket is in ``sockdir``; its server is stopped after."""
    env = {k: v for k, v in ENV.items() if k not in ("HWPOOL_SOCKET", "HWPOOL_AUTOSTART")}
    yield {**env, "XDG_RUNTIME_DIR": str(sockdir), "HWPOOL_NUM_GPUS": "1"}
    socket = sockdir / SOCKET
    if socket.exists():
        pid = status_of(socket)["server"]["pid"]
        os.kill(pid, signal.SIGTERM)
        eventually(lambda: gone(pid), "the started server stopped")


def blocked_on(lock: Path) -> int:
    """How many processes wait for ``flock`` on ``lock`` (from /proc/locks)."""
    inode = lock.stat().st_ino
    return sum(
        1 for line in Path("/proc/locks").read_text().splitlines()
        if "->" in line and re.search(rf":{inode} ", line)
    )  # fmt: skip


def test_a_run_with_no_server_starts_one(sockdir: Path, user_env: dict[str, str]) -> None:
    run = Run(sockdir / SOCKET, sockdir, "a", env=user_env)
    assert run.finish()[0] == 0
    assert run.started()["CUDA_VISIBLE_DEVICES"] == "0"
    log = (sockdir / "hwpool" / "hwpool.sock.log").read_text()
    assert log.count("serving 1 GPU ") == 1
    pid = status_of(sockdir / SOCKET)["server"]["pid"]  # detached: still there
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--idle-timeout") + 1] == b"600"
    assert os.getsid(pid) == pid  # a session of its own: no terminal signal reaches it


def test_two_runs_at_the_same_moment_start_one_server(
    sockdir: Path, user_env: dict[str, str]
) -> None:
    # Hold the start lock until both runs wait for it: then they start at the same moment.
    directory = sockdir / "hwpool"
    directory.mkdir(mode=0o700)
    lock = directory / "hwpool.sock.start"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        runs = [
            Run(sockdir / SOCKET, sockdir, name, options=("--gpus", "0.5"), env=user_env)
            for name in ("a", "b")
        ]
        eventually(lambda: blocked_on(lock) == 2, "both runs wait for the start lock")
    finally:
        os.close(fd)
    assert [run.finish()[0] for run in runs] == [0, 0]
    log = (directory / "hwpool.sock.log").read_text()
    assert log.count("serving") == 1, log
    assert "already running" not in log


@pytest.mark.parametrize(
    ("option", "variable"), [("--no-start", None), (None, "0")], ids=["option", "variable"]
)
def test_autostart_can_be_turned_off(
    sockdir: Path, user_env: dict[str, str], option: str | None, variable: str | None
) -> None:
    env = user_env if variable is None else {**user_env, "HWPOOL_AUTOSTART": variable}
    run = Run(sockdir / SOCKET, sockdir, "a", options=(option,) if option else (), env=env)
    code, err = run.finish()
    assert code == 125 and "no hwpool server" in err
    assert not (sockdir / SOCKET).exists()


def test_a_malformed_autostart_variable_is_bad_usage(
    sockdir: Path, user_env: dict[str, str]
) -> None:
    run = Run(sockdir / SOCKET, sockdir, "a", env={**user_env, "HWPOOL_AUTOSTART": "yes"})
    code, err = run.finish()
    assert code == 2 and "HWPOOL_AUTOSTART must be 0 or 1, got 'yes'" in err


def test_no_autostart_on_a_named_socket(sockdir: Path, user_env: dict[str, str]) -> None:
    named = sockdir / "named.sock"
    run = Run(sockdir / SOCKET, sockdir, "a", options=("--socket", str(named)), env=user_env)
    assert run.finish()[0] == 125
    assert not named.exists() and not (sockdir / SOCKET).exists()


def test_an_idle_server_stops_and_the_next_run_starts_another(
    sockdir: Path, user_env: dict[str, str]
) -> None:
    server = Server(sockdir / SOCKET, "--gpus", "1", "--idle-timeout", "0.2", env=user_env)
    server.ready()
    server.wait_for("no client for 0.2 s: stopping")
    assert server.proc.wait(10) == 0
    server.kill()
    assert not (sockdir / SOCKET).exists()
    run = Run(sockdir / SOCKET, sockdir, "a", env=user_env)
    assert run.finish()[0] == 0
    assert "serving 1 GPU " in (sockdir / "hwpool" / "hwpool.sock.log").read_text()


def test_a_run_with_mem_starts_a_server_sized_in_memory(
    sockdir: Path, user_env: dict[str, str], fake_smi: Callable[[str], Path]
) -> None:
    fake_smi(smi_script([A100, RTX]))  # two GPUs, with their memory
    env = {k: v for k, v in user_env.items() if k != "HWPOOL_NUM_GPUS"}
    run = Run(sockdir / SOCKET, sockdir, "a", options=("--mem", "10GiB"),
              env={**env, "PATH": os.environ["PATH"]})  # fmt: skip
    assert run.finish()[0] == 0
    assert json.loads(run.started()["HWPOOL_LEASE"])["memory_mib"] == 10 * 1024
    report = status_of(sockdir / SOCKET)
    assert report["sized_in_memory"] and [g["total_mib"] for g in report["gpus"]] == [81920, 24564]
    argv = Path(f"/proc/{report['server']['pid']}/cmdline").read_bytes().split(b"\0")
    assert b"--memory" in argv


@pytest.mark.parametrize("suffix", [".log", ".start"])
def test_autostart_does_not_follow_a_planted_log_or_start_lock(
    sockdir: Path, user_env: dict[str, str], suffix: str
) -> None:
    directory = sockdir / "hwpool"
    directory.mkdir(mode=0o700)
    precious = sockdir / "precious"
    precious.write_text("keep me")
    (directory / f"hwpool.sock{suffix}").symlink_to(precious)
    run = Run(sockdir / SOCKET, sockdir, "a", env=user_env)
    code, err = run.finish()
    assert code == 125
    what = "log" if suffix == ".log" else "start lock"
    assert f"cannot start a server: the {what} '{directory}/hwpool.sock{suffix}'" in err
    assert "is a symbolic link" in err and "refusing to use it" in err
    assert precious.read_text() == "keep me"
    assert not (sockdir / SOCKET).exists()
