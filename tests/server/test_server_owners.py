"""Owners on a real server: each request is its client's uid's (SO_PEERCRED), and the queue
is fair between uids (issue 23): one user's flood does not hold back another user."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostserver import Server, status_of
from hwpool._core._capacity import UNITS_PER_GPU
from rawpeers import Peer, Users, connect_as, hello

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


def gpu(req: int) -> dict[str, object]:
    """An acquire of one whole GPU."""
    return {"op": "acquire", "req": req, "count": 1, "units": FULL, "wait": True}


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    """Peers to close after the test."""
    opened: list[Peer] = []
    yield opened
    for peer in opened:
        peer.close()


def test_another_user_is_granted_ahead_of_one_users_flood(
    start_server: StartServer, sockdir: Path, pair: Users, peers: list[Peer]
) -> None:
    path = sockdir / "shared" / "s.sock"
    start_server("--gpus", "2", "--group", str(pair.gid), socket=path)
    sockdir.chmod(0o711)
    alice = Peer(connect_as(pair.alice, pair.gid, path))
    bob = Peer(connect_as(pair.bob, pair.gid, path))
    peers += [alice, bob]
    alice.send(hello(), *(gpu(req) for req in range(1, 9)), {"op": "status", "req": 9})
    assert [alice.answer(req)["op"] for req in (1, 2)] == ["granted", "granted"]
    assert len(alice.answer(9)["waiting"]) == 6  # alice's flood, all queued
    bob.send(hello(), gpu(1), {"op": "status", "req": 2})
    assert len(bob.answer(2)["waiting"]) == 7  # bob queued, last in line by arrival
    first = alice.answer(1)["id"]
    alice.send({"op": "release", "req": 20, "of": first})
    granted = bob.answer(1)
    assert granted["op"] == "granted"
    status = status_of(path)
    assert sorted(x["uid"] for x in status["leases"]) == sorted([pair.alice, pair.bob])
    assert {x["uid"] for x in status["waiting"]} == {pair.alice}
    assert len(status["waiting"]) == 6
