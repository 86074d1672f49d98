"""Which server a client uses: the machine-wide one first, and no per-user server beside it.

A machine-wide server at ``HWPOOL_SYSTEM_SOCKET`` (``/run/hwpool/hwpool.sock`` by default)
shares out the machine's GPUs; an autostarted per-user server beside it would share them out
again (issue 22, item 12). Each test points both the system socket and XDG_RUNTIME_DIR (the
per-user socket) at fresh directories, and stops any server that was started.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostserver import ENV, Server, run_cli, status_of
from runproc import Run, eventually, gone


@pytest.fixture
def places(sockdir: Path) -> Iterator[tuple[dict[str, str], Path, Path]]:
    """An environment, its machine-wide socket (not served yet) and its per-user socket;
    a per-user server started meanwhile is stopped after."""
    (sockdir / "user").mkdir(mode=0o700)
    system = sockdir / "sys" / "hwpool.sock"
    user = sockdir / "user" / "hwpool" / "hwpool.sock"
    env = {k: v for k, v in ENV.items() if k not in ("HWPOOL_SOCKET", "HWPOOL_AUTOSTART")}
    env |= {
        "XDG_RUNTIME_DIR": str(sockdir / "user"), "HWPOOL_SYSTEM_SOCKET": str(system),
        "HWPOOL_NUM_GPUS": "1",
    }  # fmt: skip
    yield env, system, user
    if user.exists():
        pid = status_of(user)["server"]["pid"]
        os.kill(pid, signal.SIGTERM)
        eventually(lambda: gone(pid), "the per-user server stopped")


def test_a_run_uses_the_machine_wide_server_and_starts_none(
    places: tuple[dict[str, str], Path, Path], sockdir: Path
) -> None:
    env, system, user = places
    server = Server(system, "--gpus", "1", env=env).ready()
    try:
        run = Run(system, sockdir, "a", env=env)  # no --socket: the run chooses
        code, err = run.finish()
        assert code == 0, err
        server.wait_for(f"pid {run.pid}")  # the machine-wide server granted it
        assert not user.parent.exists()  # no per-user server was started
    finally:
        server.kill()


def test_no_per_user_server_while_the_machine_wide_one_is_away(
    places: tuple[dict[str, str], Path, Path], sockdir: Path
) -> None:
    env, system, user = places
    server = Server(system, "--gpus", "1", env=env).ready()
    assert server.stop() == 0  # stopped, as for an upgrade: its lock file stays
    server.kill()
    run = Run(system, sockdir, "a", env=env)
    code, err = run.finish()
    assert code == 125
    assert f"the machine-wide hwpool server on '{system}' is not running" in err
    assert "set HWPOOL_SOCKET to use another server" in err
    assert not user.parent.exists()


def test_without_a_machine_wide_server_the_per_user_one_is_started(
    places: tuple[dict[str, str], Path, Path], sockdir: Path
) -> None:
    env, system, user = places
    run = Run(user, sockdir, "a", env=env)
    assert run.finish()[0] == 0
    assert user.exists() and not system.parent.exists()


def test_status_and_info_name_the_machine_wide_server(
    places: tuple[dict[str, str], Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    env, system, user = places
    for name in ("HWPOOL_SOCKET", "HWPOOL_AUTOSTART"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run_cli("info", "--json")
    assert code == 0, err
    assert json.loads(out)["server"] == {
        "socket": str(user), "kind": "per-user", "source": "XDG_RUNTIME_DIR",
        "running": False, "autostart": True, "system_socket": str(system),
    }  # fmt: skip
    server = Server(system, "--gpus", "1", env=env).ready()
    try:
        code, out, err = run_cli("info", "--json")
        assert json.loads(out)["server"] == {
            "socket": str(system), "kind": "machine-wide", "source": "system",
            "running": True, "autostart": False, "system_socket": str(system),
        }  # fmt: skip
        text = run_cli("info")[1].splitlines()
        assert f"Server: hwpool run uses {system} (the machine-wide server;" in text[-1]
        code, out, err = run_cli("status", "--json")  # no --socket either
        assert code == 0 and json.loads(out)["server"]["pid"] == server.proc.pid
    finally:
        server.kill()


def test_a_bad_system_socket_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPOOL_SOCKET", raising=False)
    monkeypatch.setenv("HWPOOL_SYSTEM_SOCKET", "relative/hwpool.sock")
    code, _, err = run_cli("status")
    assert code == 2
    assert "HWPOOL_SYSTEM_SOCKET must be an absolute path, got 'relative/hwpool.sock'" in err
