"""Every wait explained on a real server (issue 37): the status carries each waiter's
reason, detail and estimated start (wall clock), ``hwpool status`` (text and ``--json``)
shows them, and the metrics count the waiters per reason."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from hostserver import BOUND, Server, run_cli, status_of
from hwpool._core._capacity import UNITS_PER_GPU
from rawpeers import Peer, acquire, hello

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


def _peer(path: Path) -> Peer:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(BOUND)
    sock.connect(str(path))
    return Peer(sock)


def test_status_says_why_each_request_waits_and_when_it_should_start(
    start_server: StartServer, sockdir: Path, peers: list[Peer]
) -> None:
    path = sockdir / "s.sock"
    start_server("--gpus", "1", socket=path)
    peer = _peer(path)
    peers.append(peer)
    before = time.time()
    # One GPU: a lease with a limit of 600 s, then two waiters behind it.
    peer.send(hello(), {**acquire(1), "limit_s": 600.0})
    assert peer.answer(1)["op"] == "granted"
    peer.send({**acquire(2), "limit_s": 100.0}, acquire(3, units=FULL // 2))
    peer.send({"op": "status", "req": 4})
    first, second = peer.answer(4)["waiting"]
    after = time.time()
    assert first["reason"] == "resources"
    assert "needs a whole GPU; 0 free now" in first["reason_detail"]
    # The lease ends by its limit, 600 s after it was granted; the first then runs its 100 s.
    assert before + 600 - 1 <= first["estimated_start"] <= after + 600 + 1
    assert second["reason"] == "priority"
    assert "first: ticket" in second["reason_detail"]
    assert abs(second["estimated_start"] - (first["estimated_start"] + 100)) < 0.01
    # hwpool status --json carries them, the text shows them.
    report = status_of(path)
    assert [w["reason"] for w in report["waiting"]] == ["resources", "priority"]
    assert abs(report["waiting"][0]["estimated_start"] - first["estimated_start"]) < 1
    code, out, err = run_cli("status", "--socket", str(path))
    assert code == 0, err
    one, two = (x for x in out.splitlines() if x.startswith(("  1. #", "  2. #")))
    assert "-- resources: needs a whole GPU" in one and "starts in about 10 min" in one
    assert "-- priority: 1 waiting ahead" in two and "starts in about 12 min" in two


def test_a_wait_nothing_bounds_has_no_estimate(
    start_server: StartServer, sockdir: Path, peers: list[Peer]
) -> None:
    path = sockdir / "s.sock"
    start_server("--gpus", "1", socket=path)
    peer = _peer(path)
    peers.append(peer)
    peer.send(hello(), acquire(1), acquire(2))  # the lease has no limit, nothing is learned
    assert peer.answer(1)["op"] == "granted"
    (waiter,) = status_of(path)["waiting"]
    assert (waiter["reason"], waiter["estimated_start"]) == ("resources", None)
    code, out, err = run_cli("status", "--socket", str(path))
    assert code == 0, err
    assert "-- resources: needs a whole GPU; 0 free now; reserves GPU 0; start unknown" in out
