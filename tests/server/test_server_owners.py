"""Owners on a real server: each request is its client's uid's (SO_PEERCRED), and the queue
is fair between uids (issue 23): one user's flood does not hold back another user."""

from __future__ import annotations

import os
import pwd
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from hostserver import BOUND, Server, run_cli, status_of
from hwpool import GPUPool
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._wire._protocol import MAX_PRIORITY
from rawpeers import Pair, Peer, acquire, connect_as, hello
from runproc import eventually

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


def test_another_user_is_granted_ahead_of_one_users_flood(
    start_server: StartServer, sockdir: Path, pair: Pair, peers: list[Peer]
) -> None:
    path = sockdir / "shared" / "s.sock"
    start_server("--gpus", "2", "--group", str(pair.gid), socket=path)
    sockdir.chmod(0o711)
    alice = Peer(connect_as(pair.alice, pair.gid, path))
    bob = Peer(connect_as(pair.bob, pair.gid, path))
    peers += [alice, bob]
    alice.send(hello(), *(acquire(req) for req in range(1, 9)), {"op": "status", "req": 9})
    assert [alice.answer(req)["op"] for req in (1, 2)] == ["granted", "granted"]
    assert len(alice.answer(9)["waiting"]) == 6  # alice's flood, all queued
    bob.send(hello(), acquire(1), {"op": "status", "req": 2})
    assert len(bob.answer(2)["waiting"]) == 7  # bob queued, last in line by arrival
    first = alice.answer(1)["id"]
    alice.send({"op": "release", "req": 20, "of": first})
    granted = bob.answer(1)
    assert granted["op"] == "granted"
    status = status_of(path)
    assert sorted(x["uid"] for x in status["leases"]) == sorted([pair.alice, pair.bob])
    assert {x["uid"] for x in status["waiting"]} == {pair.alice}
    assert len(status["waiting"]) == 6


def test_a_pools_priority_over_the_unix_backend_orders_its_users_requests(
    start_server: StartServer, peers: list[Peer]
) -> None:
    server = start_server("--gpus", "1")
    holder = Peer(connect_as(os.getuid(), os.getgid(), server.socket))
    peers.append(holder)
    holder.send(hello(), acquire(1))
    assert holder.answer(1)["op"] == "granted"
    pool = GPUPool(backend=UnixBackend(server.socket))
    order: list[str] = []

    def take(name: str, priority: int) -> None:
        gpu_id = pool.acquire_blocking(1.0, timeout=BOUND, priority=priority)
        order.append(name)
        pool.release(gpu_id)

    threads = []
    for count, (name, priority) in enumerate((("head", 0), ("low", -3), ("high", 3)), 1):
        thread = threading.Thread(target=take, args=(name, priority))
        thread.start()
        threads.append(thread)
        eventually(lambda n=count: len(status_of(server.socket)["waiting"]) == n, f"{name} waits")
    holder.send({"op": "release", "req": 2, "of": holder.answer(1)["id"]})
    for thread in threads:
        thread.join(BOUND)
    pool.close()
    assert order == ["head", "high", "low"]  # the head keeps its place (rule 10e)


def test_a_priority_out_of_bounds_is_refused_before_it_is_sent(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    pool = GPUPool(backend=UnixBackend(server.socket))
    with pytest.raises(ValueError, match="priority"):
        pool.acquire_blocking(1.0, timeout=BOUND, priority=MAX_PRIORITY + 1)
    assert status_of(server.socket)["waiting"] == []
    pool.release(pool.acquire_blocking(1.0, timeout=BOUND, priority=-MAX_PRIORITY))
    pool.close()


def test_status_shows_each_user_with_share_usage_running_and_queued(
    start_server: StartServer, sockdir: Path, pair: Pair, peers: list[Peer]
) -> None:
    config = sockdir / "serve.toml"
    config.write_text(f'half_life = "1h"\n[shares]\n"uid:{pair.alice}" = 2\n')
    path = sockdir / "shared" / "s.sock"
    start_server("--gpus", "1", "--group", str(pair.gid), "--config", str(config), socket=path)
    sockdir.chmod(0o711)
    alice = Peer(connect_as(pair.alice, pair.gid, path))
    bob = Peer(connect_as(pair.bob, pair.gid, path))
    peers += [alice, bob]
    alice.send(hello(), acquire(1), acquire(2), {"op": "status", "req": 3})
    assert alice.answer(1)["op"] == "granted" and alice.answer(3)["op"] == "status"
    bob.send(hello(), acquire(1), {"op": "status", "req": 2})
    assert bob.answer(2)["op"] == "status"
    owners = status_of(path)["owners"]
    assert [(o["uid"], o["share"], o["running"], o["queued"]) for o in owners] == [
        (pair.alice, 2.0, 1.0, 1), (pair.bob, 1.0, 0.0, 1),
    ]  # fmt: skip
    assert owners[0]["usage_gpu_s"] > 0 and owners[1]["usage_gpu_s"] == 0
    assert owners[0]["user"] == pwd.getpwuid(pair.alice).pw_name
    code, out, err = run_cli("status", "--socket", str(path))
    assert code == 0, err
    table = out[out.index("owners (2; usage: GPU-seconds, decayed):") :].splitlines()
    assert table[1].split() == ["user", "share", "usage", "running", "queued"]
    name, share, usage, running, queued = table[2].split()
    assert (name, share, running, queued) == (pwd.getpwuid(pair.alice).pw_name, "2", "1.00", "1")
    assert float(usage) >= 0
    assert table[3].split() == [pwd.getpwuid(pair.bob).pw_name, "1", "0.0", "0.00", "1"]
