"""Accounts on a real server (issue 23): the config file's ``[accounts]`` schedules its
members, real Unix users, as one owner, so that they share one fair share against a user in
no account; ``hwpool status`` shows the account with its members' usage together."""

from __future__ import annotations

import pwd
from collections.abc import Callable
from pathlib import Path

from hostserver import Server, run_cli, status_of
from hwpool._core._capacity import UNITS_PER_GPU
from rawpeers import Pair, Peer, acquire, connect_as, hello
from users import Users

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


def test_an_accounts_two_users_share_one_fair_share_against_a_third_user(
    start_server: StartServer, sockdir: Path, pair: Pair, users: Users, peers: list[Peer]
) -> None:
    """On one GPU, alice (of account team) holds it; bob (of team) queues, then carol (in no
    account). Alone, bob and carol would both have no usage and bob, first in line, would be
    served first (as test_server_owners shows for two users); in one account with alice,
    bob shares her usage, and carol goes first."""
    carol = users.user([pair.gid])
    alice_name = pwd.getpwuid(pair.alice).pw_name
    config = sockdir / "serve.toml"
    config.write_text(f'[accounts]\nteam = ["{alice_name}", "uid:{pair.bob}"]\n')
    config.chmod(0o644)
    path = sockdir / "shared" / "s.sock"
    server = start_server(
        "--gpus", "1", "--group", str(pair.gid), "--config", str(config), socket=path
    )  # fmt: skip
    members = ", ".join(map(str, sorted([pair.alice, pair.bob])))
    server.wait_for(f"accounts: team (uids {members})")
    sockdir.chmod(0o711)
    alice = Peer(connect_as(pair.alice, pair.gid, path))
    bob = Peer(connect_as(pair.bob, pair.gid, path))
    third = Peer(connect_as(carol.uid, pair.gid, path))
    peers += [alice, bob, third]
    alice.send(hello(), acquire(1))
    lease = alice.answer(1)
    assert lease["op"] == "granted"
    bob.send(hello(), acquire(1), {"op": "status", "req": 2})
    assert len(bob.answer(2)["waiting"]) == 1
    third.send(hello(), acquire(1), {"op": "status", "req": 2})
    # carol queued after bob, and is ahead of him: team has alice's usage, carol none
    assert [w["uid"] for w in third.answer(2)["waiting"]] == [carol.uid, pair.bob]
    alice.send({"op": "release", "req": 2, "of": lease["id"]})
    assert third.answer(1)["op"] == "granted"  # carol, not bob: team has alice's usage
    status = status_of(path)
    assert [(w["uid"], w.get("account")) for w in status["waiting"]] == [(pair.bob, "team")]
    carols, team = status["owners"]  # hwpool status --json: uids and accounts together
    assert (carols["uid"], carols["account"], carols["running"], carols["queued"]) == (
        carol.uid, None, 1.0, 0,
    )  # fmt: skip
    assert (team["uid"], team["user"], team["account"]) == (None, None, "team")
    assert (team["share"], team["running"], team["queued"]) == (1.0, 0.0, 1)
    assert team["usage_gpu_s"] > 0  # alice's GPU-seconds, now the account's
    code, out, err = run_cli("status", "--socket", str(path))
    assert code == 0, err
    bob_name = pwd.getpwuid(pair.bob).pw_name
    assert f"  1. #2 {bob_name} (account team) pid " in out
    table = out[out.index("owners (2; usage: GPU-seconds, decayed):") :].splitlines()
    assert table[2].split()[:2] == [carol.name, "1"]
    assert table[3].split()[:3] == ["account", "team", "1"]
    assert table[3].split()[4:] == ["0.00", "1"]
