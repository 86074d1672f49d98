"""``hwpool serve --metrics-port`` on a shared machine: the port cannot hurt the server, and
tells whoever reaches it only aggregates.

Any local user can connect to the metrics port (it is TCP: no SO_PEERCRED, no group). Each
test starts the real server on a temporary socket with metrics on a free port, then acts as
such a user: floods the port with idle connections (the server limited to few descriptors,
so that a few hundred are enough to show what a thousand would do to a default limit),
holds connections open without a request, sends half a request or one too large, and reads
what the port says about the members' leases and requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import select
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="the metrics need prometheus-client")

from prometheus_client.parser import text_string_to_metric_families

from hostserver import BOUND, Server, run_cli
from hwpool._core._explain import Reason
from hwpool._server._metrics_http import MetricsListener, listen
from rawpeers import LinePeer, Pair, Peer, acquire, connect_as, hello

StartServer = Callable[..., Server]
NOFILE = 128  # the server's descriptor limit in the flood test
DEFAULT_CAP = 16  # the documented default of --metrics-max-connections (docs/server.md)
WAIT_BUCKETS = {"0.01", "0.1", "0.5", "1", "5", "15", "60", "300", "900", "3600", "14400",
                "43200", "+Inf"}  # fmt: skip
SIZES = {"fraction", "memory", "1gpu", "2gpus", "3-4gpus", "5-8gpus", "9+gpus"}


# ----------------------------------------------------------------- helpers
def metrics_address(server: Server) -> tuple[str, int]:
    """Where the server's log says its metrics listen."""
    line = server.wait_for("metrics on ")
    found = re.search(r"http://([\d.]+):(\d+)/metrics", line)
    assert found, line
    return found.group(1), int(found.group(2))


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=BOUND)
    sock.settimeout(BOUND)
    return sock


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    """TCP connections a test opens, closed after it."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by BOUND: a
    connection still open then fails the test)."""
    data = b""
    deadline = time.monotonic() + BOUND
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the connection is still open after {BOUND} s (got {data[:80]!r})"
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue  # the deadline decides
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (it sent nothing: idle connections get no
    answer), without waiting."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, TimeoutError):  # nothing yet (TimeoutError: a socket timeout)
        return False
    except ConnectionResetError:
        return True


def wait_until_closed(socks: list[socket.socket], at_least: int) -> int:
    """Wait (bounded) until the server has closed ``at_least`` of ``socks``; how many it has."""
    done: set[int] = set()
    deadline = time.monotonic() + BOUND
    while len(done) < at_least:
        left = deadline - time.monotonic()
        assert left > 0, f"the server closed {len(done)} of {len(socks)}, not {at_least}"
        waiting = [s for i, s in enumerate(socks) if i not in done]
        readable, _, _ = select.select(waiting, [], [], min(left, 0.5))
        done |= {socks.index(s) for s in readable if closed(s)}
    return len(done)


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^Threads:\s+(\d+)$", status, re.MULTILINE)
    assert found, status
    return int(found.group(1))


def descriptors_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(address: tuple[str, int]) -> str:
    url = f"http://{address[0]}:{address[1]}/metrics"
    with urllib.request.urlopen(url, timeout=BOUND) as answer:
        assert answer.status == 200
        return str(answer.read().decode())


def scrape_soon(address: tuple[str, int]) -> str:
    """A scrape that succeeds before BOUND, tried again while the server closes it at once
    (it is at its connection cap)."""
    deadline = time.monotonic() + BOUND
    while True:
        try:
            return scrape(address)
        except (ConnectionError, urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                raise


# ----------------------------------------------------------------- the port cannot hurt
def test_a_flood_of_idle_connections_leaves_the_queue_serving(
    start_server: StartServer, opened: list[socket.socket]
) -> None:
    """Twice as many idle connections as the server may open descriptors: a member still
    connects and gets a lease, and the server holds no thread or descriptor per connection
    beyond the cap (those over it are closed at once)."""
    server = start_server("--gpus", "1", "--metrics-port", "0", nofile=NOFILE)
    address = metrics_address(server)
    pid = server.proc.pid
    threads, descriptors = threads_of(pid), descriptors_of(pid)
    for _ in range(2 * NOFILE):
        try:
            opened.append(connect(address))
        except OSError:  # the server no longer accepts: the defect itself (see below)
            break
    member = LinePeer(server.socket)
    try:
        assert member.acquire(1, name="after-the-flood") == "granted"
    finally:
        member.close()
    assert len(opened) == 2 * NOFILE  # every connection was accepted (and most closed)
    wait_until_closed(opened, at_least=len(opened) - DEFAULT_CAP)
    assert threads_of(pid) <= threads + 1
    assert descriptors_of(pid) <= descriptors + DEFAULT_CAP + 2
    for sock in opened:  # the flood ends: the port answers again
        sock.close()
    assert "# TYPE hwpool_gpus gauge" in scrape_soon(address)


def test_connections_over_the_cap_are_closed_at_once(
    start_server: StartServer, opened: list[socket.socket]
) -> None:
    server = start_server(
        "--gpus", "1", "--metrics-port", "0", "--metrics-max-connections", "2",
        "--metrics-timeout", "60",
    )  # fmt: skip
    address = metrics_address(server)
    opened += [connect(address), connect(address)]  # the cap, held idle
    over = connect(address)
    opened.append(over)
    assert read_to_end(over) == b""  # closed within BOUND, long before its 60 s
    assert not closed(opened[0]) and not closed(opened[1])
    opened[0].close()  # a slot frees up: scrapes are answered again
    text = scrape_soon(address)
    (refused,) = re.findall(r"^hwpool_metrics_connections_refused_total (\S+)$", text, re.M)
    assert float(refused) >= 1  # that one, and any scrape tried before the slot was free


def test_an_idle_or_half_sent_request_is_closed_after_the_timeout(
    start_server: StartServer, opened: list[socket.socket]
) -> None:
    server = start_server("--gpus", "1", "--metrics-port", "0", "--metrics-timeout", "0.3")
    address = metrics_address(server)
    idle, half = connect(address), connect(address)
    opened += [idle, half]
    half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
    assert read_to_end(idle) == b""
    assert read_to_end(half) == b""
    assert "# TYPE hwpool_gpus gauge" in scrape(address)  # the server goes on answering


def test_an_answer_not_taken_is_dropped_after_the_timeout() -> None:
    """A client that asks and never reads: the answer (larger than the sockets' buffers)
    cannot be sent, and the connection is dropped after the timeout (the port itself, in
    this process, on a real socket: the server's answers are too small to fill a buffer)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        body = b"x" * (32 << 20)
        port = MetricsListener(listen("127.0.0.1", 0), lambda: ("text/plain", body), 4, 0.3)
        port.start(loop)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.setblocking(False)
        try:
            await loop.sock_connect(client, port.sock.getsockname())
            await loop.sock_sendall(client, b"GET /metrics HTTP/1.1\r\n\r\n")
            deadline = loop.time() + BOUND
            while not port.tasks:  # accepted in a later turn of the loop
                assert loop.time() < deadline, "never accepted"
                await asyncio.sleep(0)
            _, pending = await asyncio.wait(set(port.tasks), timeout=BOUND)
            assert not pending, "the connection is still served after BOUND"
        finally:
            client.close()
            port.stop()

    asyncio.run(main())


def test_a_request_too_large_is_refused(
    start_server: StartServer, opened: list[socket.socket]
) -> None:
    server = start_server("--gpus", "1", "--metrics-port", "0")
    address = metrics_address(server)
    sock = connect(address)
    opened.append(sock)
    with contextlib.suppress(ConnectionError):  # it may close before reading it all
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n")
    answer = read_to_end(sock)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer[:200]


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"GET /metrics HTTP/1.1", b"200"),
        (b"GET /?name[]=hwpool_gpus HTTP/1.0", b"200"),
        (b"HEAD /metrics HTTP/1.1", b"200"),
        (b"GET /other HTTP/1.1", b"404"),
        (b"POST /metrics HTTP/1.1", b"405"),
        (b"nonsense", b"400"),
    ],
)
def test_each_request_is_answered_once_and_closed(
    start_server: StartServer, opened: list[socket.socket], request_line: bytes, status: bytes
) -> None:
    server = start_server("--gpus", "1", "--metrics-port", "0")
    sock = connect(metrics_address(server))
    opened.append(sock)
    sock.sendall(request_line + b"\r\nHost: x\r\n\r\n")
    answer = read_to_end(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].startswith(b"HTTP/1.1 " + status + b" "), answer[:200]
    assert b"Connection: close" in head
    if request_line.startswith(b"GET /metrics"):
        assert b"hwpool_gpus 1.0" in body
    if request_line.startswith(b"HEAD"):
        assert body == b""


# ----------------------------------------------------------------- the bounds as settings
def test_the_bounds_are_flags_and_config_keys(sockdir: Path) -> None:
    config = sockdir / "serve.toml"
    config.write_text('metrics_max_connections = 4\nmetrics_timeout = "2s"\n')
    code, out, err = run_cli("serve", "--socket", str(sockdir / "s.sock"), "--config",
                             str(config), "--check-config")  # fmt: skip
    assert (code, err) == (0, "")
    assert "metrics_max_connections = 4\n" in out and "metrics_timeout = 2.0\n" in out
    code, out, _ = run_cli("serve", "--socket", str(sockdir / "s.sock"), "--check-config")
    assert "metrics_max_connections = 16\n" in out and "metrics_timeout = 5.0\n" in out
    config.write_text("metrics_max_connections = 0\n")
    code, _, err = run_cli("serve", "--socket", str(sockdir / "s.sock"), "--config",
                           str(config), "--check-config")  # fmt: skip
    assert code == 2 and "line 1: metrics_max_connections: must be an integer >= 1" in err


@pytest.mark.parametrize(
    ("flag", "bad", "said"),
    [
        ("--metrics-max-connections", "0", "must be an integer >= 1, got 0"),
        ("--metrics-timeout", "-1", "must be a number of seconds > 0, got '-1'"),
    ],
)
def test_a_bad_bound_is_refused_naming_it(sockdir: Path, flag: str, bad: str, said: str) -> None:
    path = sockdir / "s.sock"
    code, out, err = run_cli("serve", "--socket", str(path), "--metrics-port", "0", flag, bad)
    assert (code, out) == (2, "")
    assert f"argument {flag}: {said}" in err
    assert not path.exists()


# ----------------------------------------------------------------- the port tells no one
def test_the_metrics_name_no_user_and_no_job(
    start_server: StartServer, sockdir: Path, pair: Pair, peers: list[Peer]
) -> None:
    """Two members hold and wait for GPUs with named jobs; what the TCP port says (to anyone
    on the machine, members or not) has only aggregates: no user, uid, pid, lease or job."""
    path = sockdir / "shared" / "s.sock"
    server = start_server("--gpus", "2", "--group", str(pair.gid), "--metrics-port", "0",
                          socket=path)  # fmt: skip
    sockdir.chmod(0o711)
    address = metrics_address(server)
    alice = Peer(connect_as(pair.alice, pair.gid, path))
    bob = Peer(connect_as(pair.bob, pair.gid, path))
    peers += [alice, bob]
    secret = {"name": "alice-secret-job", "command": "python train.py --data /home/alice/x"}
    alice.send(hello(), {**acquire(1), **secret}, {**acquire(2), "name": "alice-second"})
    assert [alice.answer(req)["op"] for req in (1, 2)] == ["granted", "granted"]
    bob.send(hello(), {**acquire(1), "name": "bob-waits-here", "command": "bob-command"})
    bob.send({"op": "status", "req": 2})
    assert len(bob.answer(2)["waiting"]) == 1
    alice.send({"op": "release", "req": 3, "of": alice.answer(1)["id"]})
    assert bob.answer(1)["op"] == "granted"  # bob waited: a wait is observed

    text = scrape(address)
    # Revocations' reasons, and waiters' (a fixed set: issue 37), never a name.
    reasons = {"cancel", "limit", "overuse", *(r.value for r in Reason)}
    allowed = {"gpu": {"0", "1"}, "size": SIZES, "reason": reasons, "le": WAIT_BUCKETS}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, value in sample.labels.items():
                assert value in allowed.get(label, set()), (sample.name, label, value)
    # (uids and pids are numbers: the labels' values above are where they could appear)
    names = [pwd.getpwuid(uid).pw_name for uid in (pair.alice, pair.bob, os.getuid())]
    text = text.replace('reason="owner-limit"', "")  # a waiter's reason, a fixed word
    for word in [*names, "alice-secret-job", "alice-second", "bob-waits-here", "train.py",
                 "bob-command", "owner", "lease=", "uid", "pid"]:  # fmt: skip
        assert word not in text, word
    assert "hwpool_leases 2.0" in text
    assert 'hwpool_wait_seconds_count{size="1gpu"} 3.0' in text  # granted, over all users
