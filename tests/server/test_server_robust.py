"""``hwpool serve`` against hostile or broken clients, and its start-up rules, for real.

Each bad message gets an error reply (and, where the stream cannot go on, a closed
connection); the server keeps serving everyone else, which every test checks at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostserver import BOUND, ENV, Server, run_cli, running_server
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand

StartServer = Callable[..., Server]
HELLO = b'{"op":"hello","version":1,"client":"test"}\n'


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(BOUND)
    sock.connect(str(path))
    return sock


def replies(sock: socket.socket) -> list[dict[str, object]]:
    """Every message until the server closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def one_reply(sock: socket.socket) -> dict[str, object]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return json.loads(data)  # type: ignore[no-any-return]


def welcomed(path: Path) -> socket.socket:
    sock = connect(path)
    sock.sendall(HELLO)
    assert one_reply(sock)["op"] == "welcome"
    return sock


def still_serves(path: Path) -> None:
    """A well-behaved client can still acquire and release."""
    backend = UnixBackend(path)
    try:
        grant = backend.acquire_blocking(Demand(1, UNITS_PER_GPU // 2), 5.0)
        backend.release(grant)
        assert backend.snapshot().waiting == ()
    finally:
        backend.close()


@pytest.fixture(scope="module")
def shared() -> Iterator[Server]:
    """One server for the tests that leave it as they found it."""
    with running_server("--gpus", "2", "--hello-timeout", "0.3") as server:
        yield server


@pytest.fixture
def server(start_server: StartServer) -> Server:
    """A server of the test's own (it is stopped, capped or opened up)."""
    return start_server("--gpus", "2", "--hello-timeout", "0.3", "--max-connections", "6")


# ----------------------------------------------------------------- fatal: it closes
@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"{not json\n", "bad_json"),
        (b"\xff\xfe\xfd\n", "bad_json"),
        (b"[1, 2, 3]\n", "bad_json"),
        (b'{"op":"hello","version":99,"client":"future"}\n', "version"),
        (b'{"op":"status","req":1}\n', "hello_first"),
        (b"x" * 70_000, "too_long"),
        (b'{"op":"hello"', "timeout"),  # half a message, then silence
        (b"", "timeout"),  # connects and sends nothing
    ],
)
def test_fatal_messages_get_an_error_and_a_closed_connection(
    shared: Server, payload: bytes, code: str
) -> None:
    sock = connect(shared.socket)
    sock.sendall(payload)
    got = replies(sock)
    assert [m["op"] for m in got] == ["error"] and got[0]["code"] == code
    still_serves(shared.socket)


def test_a_second_hello_and_oversized_lines_after_hello_are_fatal(shared: Server) -> None:
    sock = welcomed(shared.socket)
    sock.sendall(HELLO)
    assert replies(sock)[0]["code"] == "hello_first"
    sock = welcomed(shared.socket)
    sock.sendall(b'{"op":"status","req":1,"pad":"' + b"y" * 70_000 + b'"}\n')
    assert replies(sock)[0]["code"] == "too_long"
    still_serves(shared.socket)


def test_half_a_message_after_hello_times_out(shared: Server) -> None:
    sock = welcomed(shared.socket)
    sock.sendall(b'{"op":"stat')
    assert replies(sock)[0]["code"] == "timeout"


def test_an_idle_client_after_hello_is_left_alone(shared: Server) -> None:
    idle = welcomed(shared.socket)
    silent = connect(shared.socket)  # opened later, so it has been idle for less time
    assert replies(silent)[0]["code"] == "timeout"
    idle.sendall(b'{"op":"status","req":3}\n')
    assert one_reply(idle)["op"] == "status"


# ----------------------------------------------------------------- not fatal: it goes on
@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b'{"op":"format_disk","req":1}', "unknown_op"),
        (b'{"req":1}', "bad_message"),
        (b'{"op":"acquire","req":1,"count":"1","units":5,"wait":true}', "bad_message"),
        (b'{"op":"acquire","req":1,"count":1,"units":5,"wait":1}', "bad_message"),
        (b'{"op":"acquire","req":1,"count":9,"units":1,"wait":true}', "bad_request"),
        (b'{"op":"release","req":1,"of":77}', "not_found"),
        (b'{"op":"cancel","req":1,"id":12345}', "not_found"),
    ],
)
def test_bad_requests_get_an_error_and_the_connection_goes_on(
    shared: Server, line: bytes, code: str
) -> None:
    sock = welcomed(shared.socket)
    sock.sendall(line + b"\n")
    reply = one_reply(sock)
    assert reply["op"] == "error" and reply["code"] == code and reply["req"] in (1, None)
    sock.sendall(b'{"op":"status","req":2}\n')
    assert one_reply(sock)["op"] == "status"
    still_serves(shared.socket)


def test_a_client_cannot_touch_another_clients_lease(shared: Server) -> None:
    owner = welcomed(shared.socket)
    owner.sendall(b'{"op":"acquire","req":1,"count":1,"units":1,"wait":true}\n')
    granted = one_reply(owner)
    assert granted["op"] == "granted"
    other = welcomed(shared.socket)
    other.sendall(b'{"op":"release","req":1,"of":1}\n')  # its own req 1: it has none
    assert one_reply(other)["code"] == "not_found"
    other.sendall(b'{"op":"withdraw","req":2,"of":1,"timed_out":false}\n')  # not answered
    other.sendall(b'{"op":"status","req":3}\n')
    assert len(one_reply(other)["leases"]) == 1  # type: ignore[arg-type]


def test_bye_frees_everything_answers_and_closes(shared: Server) -> None:
    sock = welcomed(shared.socket)
    sock.sendall(b'{"op":"acquire","req":1,"count":1,"units":1,"wait":true}\n')
    sock.sendall(b'{"op":"bye","req":2}\n')
    assert [(m["op"], m["req"]) for m in replies(sock)] == [("granted", 1), ("ok", 2)]
    still_serves(shared.socket)


def test_connections_per_uid_are_capped(server: Server) -> None:
    socks = [welcomed(server.socket) for _ in range(6)]
    extra = connect(server.socket)  # it might be a control connection: its hello tells
    extra.sendall(HELLO)
    got = replies(extra)
    assert got[0]["code"] == "refused" and "6 connections" in str(got[0]["message"])
    for sock in socks:
        sock.sendall(b'{"op":"status","req":1}\n')
        assert one_reply(sock)["op"] == "status"
        sock.close()


def test_nothing_a_client_sends_crashes_the_server(shared: Server) -> None:
    garbage = [b"\x00" * 100 + b"\n", b'{"op":null}\n', b'{"op":"acquire","req":1e400}\n',
               b'{"op":"acquire","req":1,"count":1,"units":5,"wait":true,"name":[1]}\n',
               b"\n\n\n", b"{}" * 5000 + b"\n", b'"' * 10 + b"\n"]  # fmt: skip
    for payload in garbage:
        sock = welcomed(shared.socket)
        sock.sendall(payload)
        sock.close()
    still_serves(shared.socket)
    assert shared.proc.poll() is None


# ----------------------------------------------------------------- who may connect
def _in_child(uid: int, gid: int, path: Path) -> str:
    """Fork, become ``uid``/``gid``, try to use the server; return what happened."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            backend = UnixBackend(path, reconnect_timeout=0)
            backend.release(backend.acquire_blocking(Demand(1, 1), 5.0))
            outcome = "served"
        except ConnectionError as exc:
            outcome = f"ConnectionError: {exc}"
        except BaseException as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        os.write(write, outcome.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        outcome = pipe.read()
    os.waitpid(pid, 0)
    return outcome


def test_other_users_cannot_reach_a_per_user_socket(server: Server) -> None:
    assert stat.S_IMODE(server.socket.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.socket.stat().st_mode) == 0o600
    outcome = _in_child(54321, 54321, server.socket)
    assert outcome.startswith("ConnectionError: the hwpool server on") and (
        "does not serve you (permission denied)" in outcome
    ), outcome
    assert "hwpool serve`" not in outcome  # no server of one's own suggested (issue 35)


def test_the_server_refuses_other_uids_even_if_the_socket_lets_them_in(server: Server) -> None:
    os.chmod(server.socket.parent, 0o755)  # (a client refuses a directory others may write)
    os.chmod(server.socket, 0o777)
    outcome = _in_child(54321, 54321, server.socket)
    assert "uid 54321 may not use this server" in outcome
    server.wait_for("closing connection of uid 54321")
    still_serves(server.socket)


def test_group_members_are_served_by_a_machine_wide_server(
    start_server: StartServer, sockdir: Path
) -> None:
    socket_path = sockdir / "shared" / "s.sock"
    server = start_server("--gpus", "1", "--group", "4242", socket=socket_path)
    info = socket_path.parent.stat()
    assert stat.S_IMODE(info.st_mode) == 0o750 and info.st_gid == 4242
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o660 and socket_path.stat().st_gid == 4242
    os.chmod(sockdir, 0o755)  # let the others reach the shared directory
    assert _in_child(54321, 4242, socket_path) == "served"
    refused = _in_child(54322, 4343, socket_path)  # the group is named (issue 35)
    assert "serves only its owner and the members of group 'gid 4242'" in refused, refused
    server.stop()


# ----------------------------------------------------------------- starting and stopping
def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwpool", "serve", *args],
        capture_output=True, text=True, env=ENV, timeout=BOUND, check=False,
    )  # fmt: skip


def test_a_second_server_on_a_live_socket_exits_2(shared: Server) -> None:
    proc = serve("--socket", str(shared.socket), "--gpus", "1")
    assert proc.returncode == 2
    assert proc.stderr.startswith("hwpool: error: a server is already running on")
    assert f"(pid {shared.proc.pid})" in proc.stderr and len(proc.stderr.splitlines()) == 1
    still_serves(shared.socket)


def test_a_stale_socket_is_replaced(start_server: StartServer, sockdir: Path) -> None:
    path = sockdir / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a SIGKILLed server leaves
    start_server("--gpus", "1", socket=path)
    still_serves(path)


def test_a_file_that_is_not_a_socket_is_not_replaced(sockdir: Path) -> None:
    path = sockdir / "s.sock"
    path.write_text("precious")
    code, _, err = run_cli("serve", "--socket", str(path), "--gpus", "1")
    assert code == 2 and "is not a socket" in err
    assert path.read_text() == "precious"


def test_a_directory_of_another_user_is_refused(sockdir: Path) -> None:
    (sockdir / "theirs").mkdir()
    os.chown(sockdir / "theirs", 54321, 54321)
    code, _, err = run_cli("serve", "--socket", str(sockdir / "theirs" / "s.sock"), "--gpus", "1")
    assert code == 2 and "belongs to uid 54321" in err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--gpus", "0"), "--gpus: must be an integer >= 1"),
        (("--group", "no-such-group-here"), "no group named"),
        (("--socket", "/tmp/" + "x" * 120), "at most 107"),
        (("--grace", "-1"), "--grace: must be a number of seconds > 0"),
    ],
)
def test_bad_serve_usage_is_one_line_and_exit_2(args: tuple[str, ...], fragment: str) -> None:
    code, out, err = run_cli("serve", *args)
    assert code == 2 and out == "" and fragment in err and "Traceback" not in err


def test_sigterm_stops_the_server_and_removes_its_socket(server: Server) -> None:
    sock = welcomed(server.socket)
    assert server.stop(signal.SIGTERM) == 0
    assert not server.socket.exists()
    assert replies(sock)[0]["code"] == "shutting_down"
    server.wait_for("stopped")
