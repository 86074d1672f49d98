"""Every wait explained on a real server (issue 37): the status carries each waiter's
reason, detail and estimated start (wall clock), ``hwpool status`` (text and ``--json``)
shows them, and the metrics count the waiters per reason."""

from __future__ import annotations

import os
import pwd
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hostserver import BOUND, Server, run_cli, status_of
from hwpool._cli._jobs_waits import job_waits, wait_json
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._explain import Explanation, Reason
from hwpool._jobs._store import JobStore
from hwpool._server._waits import KEEP_S, Kept
from rawpeers import Peer, acquire, hello
from runproc import eventually

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


def test_a_queued_job_shows_why_its_request_waits_at_the_server(
    start_server: StartServer,
    sockdir: Path,
    peers: list[Peer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = sockdir / "s.sock"
    start_server("--gpus", "1", socket=path)
    peer = _peer(path)
    peers.append(peer)
    with JobStore.open(tmp_path / "state") as store:
        job = store.add(["python", "train.py"], environment={}, cwd="/srv")
    # The supervisor labels a queued job's request "jN NAME"; a lease of 300 s holds the GPU.
    peer.send(hello(), {**acquire(1), "limit_s": 300.0}, {**acquire(2), "name": f"{job.id} train"})
    assert peer.answer(1)["op"] == "granted"
    monkeypatch.setenv("HWPOOL_SOCKET", str(path))
    monkeypatch.delenv("HWPOOL_SYSTEM_SOCKET", raising=False)
    eventually(lambda: len(status_of(path)["waiting"]) == 1, "the job's request waits")
    me = pwd.getpwuid(os.getuid()).pw_name
    wait = job_waits([(me, job)])[me, job.id]
    assert wait.reason == "resources"
    assert wait.estimated_start is not None
    assert 290 < wait.estimated_start - time.time() <= 300
    assert wait_json(wait) == {
        "wait_reason": "resources", "wait_detail": wait.detail,
        "estimated_start": wait.estimated_start,
    }  # fmt: skip


def test_an_explanation_is_reused_while_nothing_changed_for_at_most_keep_s() -> None:
    made: list[float] = []

    def explain_now() -> dict[int, Explanation]:
        made.append(0.0)
        return {len(made): Explanation(len(made), Reason.PRIORITY, "", None)}

    kept = Kept()
    first = kept.get(5, 10.0, explain_now)
    assert kept.get(5, 10.0 + KEEP_S / 2, explain_now) is first  # unchanged, young: reused
    assert kept.get(6, 10.0 + KEEP_S / 2, explain_now) is not first  # a change: made anew
    assert len(made) == 2
    kept.get(6, 10.0 + KEEP_S * 2, explain_now)  # too old: made anew
    kept.get(6, 5.0, explain_now)  # a clock gone back: made anew
    assert len(made) == 4
