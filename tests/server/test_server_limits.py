"""Limits per user on a real server (issue 23; the core's rule 11): the config file's
``[limits]`` hold a request beyond a user's limit (shown in ``hwpool status``, granted once
the user is back under it) or refuse it with the ``limit`` error, and never another user's."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from pathlib import Path

from hostserver import Server, run_cli, status_of
from hwpool._core._capacity import UNITS_PER_GPU
from rawpeers import Pair, Peer, acquire, connect_as, hello

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


def config(directory: Path, text: str) -> str:
    path = directory / "serve.toml"
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def test_a_request_beyond_a_users_limit_waits_held_and_others_pass_it(
    start_server: StartServer, sockdir: Path, pair: Pair, peers: list[Peer]
) -> None:
    limits = config(sockdir, f'[limits.users."uid:{pair.alice}"]\ngpus = 1\n')
    path = sockdir / "shared" / "s.sock"
    server = start_server("--gpus", "2", "--group", str(pair.gid), "--config", limits, socket=path)
    server.wait_for(f"limits: uid {pair.alice} gpus=1 mode=wait")
    sockdir.chmod(0o711)
    alice = Peer(connect_as(pair.alice, pair.gid, path))
    bob = Peer(connect_as(pair.bob, pair.gid, path))
    peers += [alice, bob]
    alice.send(hello(), acquire(1), acquire(2), {"op": "status", "req": 3})
    assert alice.answer(1)["op"] == "granted"
    (waiter,) = alice.answer(3)["waiting"]  # held: one GPU stays free, and nobody reserves it
    name = pwd.getpwuid(pair.alice).pw_name
    held = "at the limit of 1 GPU held at once (has 1, needs 1 more)"
    assert waiter["uid"] == pair.alice and waiter["reserved"] == []
    assert waiter["held"].endswith(held) and name in waiter["held"]
    bob.send(hello(), acquire(1))
    assert bob.answer(1)["op"] == "granted"  # the held waiter blocks nobody
    code, out, err = run_cli("status", "--socket", str(path))
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("  1. #"))
    assert f"held: {name} (uid {pair.alice}) {held}" in line
    # Alice gives back her GPU: she is under her limit, and her waiter is granted.
    alice.send({"op": "release", "req": 4, "of": 1})
    assert alice.answer(2)["op"] == "granted"
    assert status_of(path)["waiting"] == []


def test_a_request_its_users_limits_refuse_gets_the_limit_error(
    start_server: StartServer, sockdir: Path, peers: list[Peer]
) -> None:
    limits = config(sockdir, "[limits.default]\ngpus = 1.5\nqueued = 1\n")
    server = start_server("--gpus", "2", "--config", limits)
    me = Peer(connect_as(os.getuid(), os.getgid(), server.socket))
    peers.append(me)
    me.send(hello(), acquire(1, count=2, units=FULL))
    refused = me.answer(1)
    assert (refused["op"], refused["code"]) == ("error", "limit")
    assert refused["message"] == (
        f"{pwd.getpwuid(os.getuid()).pw_name} (uid {os.getuid()}) is limited to 1.5 GPUs held "
        "at once on this server (gpus = 1.5 in its [limits]); a request for 2 GPUs could "
        "never run"
    )
    me.send(acquire(2), acquire(3, units=FULL // 2), acquire(4, units=FULL // 2))
    assert me.answer(2)["op"] == "granted" and me.answer(3)["op"] == "granted"
    me.send({"op": "status", "req": 5})
    assert len(me.answer(5)["waiting"]) == 1  # 4 waits, held: the one waiter allowed
    me.send(acquire(6, units=FULL // 4))  # would wait too: past queued = 1
    refused = me.answer(6)
    assert refused["code"] == "limit"
    assert refused["message"].endswith("it has 1 waiting, and this request would wait")
    me.send({"op": "status", "req": 7})  # the connection goes on, and nothing was queued
    status = me.answer(7)
    assert [w["units"] for w in status["waiting"]] == [FULL // 2]
    server.wait_for("refuse a request of")


def test_a_groups_limits_hold_each_member_alone(
    start_server: StartServer, sockdir: Path, pair: Pair, peers: list[Peer]
) -> None:
    limits = config(sockdir, f'[limits.groups."gid:{pair.gid}"]\nrunning = 1\n')
    path = sockdir / "shared" / "s.sock"
    start_server("--gpus", "3", "--group", str(pair.gid), "--config", limits, socket=path)
    sockdir.chmod(0o711)
    alice = Peer(connect_as(pair.alice, pair.gid, path))
    bob = Peer(connect_as(pair.bob, pair.gid, path))
    peers += [alice, bob]
    alice.send(hello(), acquire(1, units=FULL // 4), acquire(2, units=FULL // 4))
    assert alice.answer(1)["op"] == "granted"
    bob.send(hello(), acquire(1, units=FULL // 4))  # his own limit: not alice's one grant
    assert bob.answer(1)["op"] == "granted"
    (waiter,) = status_of(path)["waiting"]
    assert waiter["uid"] == pair.alice
    assert waiter["held"].endswith("at the limit of 1 running grant (has 1, needs 1 more)")


def test_a_memory_limit_on_a_server_sized_in_memory(
    start_server: StartServer, sockdir: Path, peers: list[Peer]
) -> None:
    limits = config(sockdir, '[limits.default]\nmemory = "30GiB"\n')
    server = start_server("--gpu-memory", "80GiB,24GiB", "--config", limits)
    me = Peer(connect_as(os.getuid(), os.getgid(), server.socket))
    peers.append(me)

    def mib(req: int, units: int) -> dict[str, object]:
        return {**acquire(req, units=units), "unit": "mib"}

    me.send(hello(), mib(1, 20480), mib(2, 20480), {"op": "status", "req": 3})
    assert me.answer(1)["op"] == "granted"
    (waiter,) = me.answer(3)["waiting"]
    assert waiter["held"].endswith(
        "at the limit of 30720 MiB held at once (has 20480, needs 20480 more)"
    )
    me.send(mib(4, 31744))
    refused = me.answer(4)
    assert refused["code"] == "limit"
    assert refused["message"].endswith(
        "is limited to 30720 MiB held at once on this server (memory = 30720 in its "
        "[limits]); a request for 31744 could never run"
    )
    me.send({"op": "release", "req": 5, "of": 1})
    assert me.answer(2)["op"] == "granted"  # back under the limit
