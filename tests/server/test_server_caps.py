"""One client cannot flood the server or lock its own user out: caps, and control connections.

Real servers: requests are capped per connection and per uid (an error that names the cap,
and the connection goes on); a user with every data connection it may have can still run
``hwpool status`` and ``hwpool cancel``, on control connections, which have a cap of their own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest

from hostserver import BOUND, ENV, Server, status_of
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from rawpeers import Pair, hello, lines, read_until, reply_to, talk, talk_as

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


def small(req: int) -> dict[str, object]:
    """An acquire of a tenth of a GPU."""
    return {"op": "acquire", "req": req, "count": 1, "units": FULL // 10, "wait": True}


def opened(path: Path, messages: list[dict[str, object]], until: int) -> socket.socket:
    """A connection that sent ``messages`` and got the answer to ``until``; left open."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(BOUND)
    sock.connect(str(path))
    sock.sendall(lines(messages))
    read_until(sock, until, [])
    return sock


def welcomed(path: Path, role: str | None = None) -> socket.socket:
    """A connection whose hello (with ``role``) was answered ``welcome``; left open."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(BOUND)
    sock.connect(str(path))
    sock.sendall(lines([hello(role=role)]))
    reply = first_reply(sock)
    assert reply["op"] == "welcome", reply
    return sock


def first_reply(sock: socket.socket) -> dict[str, Any]:
    """The first message the server sends on ``sock`` (to its hello)."""
    data = b""
    while b"\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return json.loads(data.split(b"\n")[0])  # type: ignore[no-any-return]


def refusal(path: Path, role: str | None = None) -> dict[str, Any]:
    """What a connection whose hello has ``role`` gets, when it is refused."""
    with closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
        sock.settimeout(BOUND)
        sock.connect(str(path))
        sock.sendall(lines([hello(role=role)]))
        return first_reply(sock)


def hwpool_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args],
        capture_output=True, text=True, env=ENV, timeout=BOUND, check=False,
    )  # fmt: skip


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    """Closes every socket a test enters into it."""
    with ExitStack() as stack:
        yield stack


# ----------------------------------------------------------------- requests per connection, uid
def test_requests_are_capped_per_connection_and_per_uid_and_the_connection_goes_on(
    start_server: StartServer, sockets: ExitStack
) -> None:
    server = start_server(
        "--gpus", "1", "--max-requests-per-connection", "2", "--max-requests-per-user", "3"
    )
    first = sockets.enter_context(opened(server.socket, [hello(), small(1), small(2)], 2))
    first.sendall(lines([small(3), {"op": "status", "req": 4}]))
    replies: list[dict[str, Any]] = []
    read_until(first, 4, replies)
    limit = reply_to(replies, 3)
    assert (limit["op"], limit["code"]) == ("error", "limit")
    assert "max-requests-per-connection 2" in limit["message"]
    assert len(reply_to(replies, 4)["leases"]) == 2  # the connection goes on

    got = talk(server.socket, [hello(), small(1), small(2)])
    assert reply_to(got, 1)["op"] == "granted"  # the uid's third
    limit = reply_to(got, 2)
    assert limit["code"] == "limit" and "max-requests-per-user 3" in limit["message"]
    assert "uid 0 already has 3 requests" in limit["message"]

    pool = UnixBackend(server.socket)  # what a library user sees (that connection is gone)
    held = pool.acquire_blocking(Demand(1, FULL // 10), BOUND)
    with pytest.raises(ConnectionError, match="max-requests-per-user 3"):
        pool.acquire_blocking(Demand(1, FULL // 10), BOUND)
    mark = len(server.lines)
    first.close()  # its two leases go: room again
    server.wait_for("gone: freed 2 leases", mark)
    pool.release(pool.acquire_blocking(Demand(1, FULL // 10), BOUND))
    pool.release(held)
    pool.close()


def test_a_user_at_the_cap_does_not_stop_another_user(
    start_server: StartServer, sockdir: Path, pair: Pair, sockets: ExitStack
) -> None:
    path = sockdir / "shared" / "s.sock"
    server = start_server("--gpus", "1", "--group", str(pair.gid),
                          "--max-requests-per-user", "2", socket=path)  # fmt: skip
    sockdir.chmod(0o711)
    sockets.enter_context(opened(server.socket, [hello(), small(1), small(2)], 2))
    assert reply_to(talk(path, [hello(), small(1)]), 1)["code"] == "limit"  # root is at its cap
    got = talk_as(pair.bob, pair.gid, path, [hello(), small(1), small(2)])
    assert [reply_to(got, req)["op"] for req in (1, 2)] == ["granted", "granted"]


# ----------------------------------------------------------------- connections: control ones
def test_status_and_cancel_work_for_a_user_with_every_connection_it_may_have(
    start_server: StartServer, sockets: ExitStack
) -> None:
    server = start_server("--gpus", "1")  # the default: 64 connections per uid
    pool = UnixBackend(server.socket)
    pool.acquire_blocking(Demand(1, FULL), BOUND)
    for _ in range(63):
        sockets.enter_context(welcomed(server.socket))
    refused = refusal(server.socket)
    assert refused["code"] == "refused" and "already has 64 connections" in refused["message"]
    assert "`hwpool status` and `hwpool cancel` still work" in refused["message"]

    shown = hwpool_cmd("status", "--socket", str(server.socket))  # the real commands
    assert shown.returncode == 0, shown.stderr
    ident = status_of(server.socket)["leases"][0]["id"]
    assert f"#{ident} root pid" in shown.stdout
    cancelled = hwpool_cmd("cancel", str(ident), "--socket", str(server.socket))
    assert cancelled.returncode == 0, cancelled.stderr
    assert (
        cancelled.stdout
        == f"#{ident}: revoked the lease of root pid {os.getpid()}: its GPUs are free once its "
        "processes are gone\n"
    )
    assert status_of(server.socket)["leases"] == []
    pool.close()


def test_control_connections_have_a_cap_of_their_own_and_may_not_acquire(
    start_server: StartServer, sockets: ExitStack
) -> None:
    server = start_server("--gpus", "1", "--max-connections", "2",
                          "--max-control-connections", "3")  # fmt: skip
    control = [sockets.enter_context(welcomed(server.socket, "control")) for _ in range(3)]
    refused = refusal(server.socket, "control")
    assert (
        refused["code"] == "refused" and "already has 3 control connections" in (refused["message"])
    )
    control[0].sendall(lines([small(1)]))
    replies: list[dict[str, Any]] = []
    read_until(control[0], 1, replies)
    assert reply_to(replies, 1)["code"] == "forbidden"
    assert "control connection" in reply_to(replies, 1)["message"]
    for _ in range(2):  # the data connections are counted apart
        sockets.enter_context(welcomed(server.socket))
    assert refusal(server.socket)["code"] == "refused"
    control[1].close()
    with closing(welcomed(server.socket, "control")):  # its place is free again
        pass


def test_connections_that_have_not_said_hello_are_bounded_too(
    start_server: StartServer, sockets: ExitStack
) -> None:
    server = start_server("--gpus", "1", "--max-connections", "2",
                          "--max-control-connections", "1")  # fmt: skip
    for _ in range(3):  # silent: each may yet be a data or a control connection
        sock = sockets.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        sock.connect(str(server.socket))
    sock = sockets.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    sock.settimeout(BOUND)
    sock.connect(str(server.socket))
    refused = first_reply(sock)  # at once, before any hello
    assert refused["code"] == "refused" and "already has 3 connections" in refused["message"]
