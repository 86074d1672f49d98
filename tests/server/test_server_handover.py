"""Lease hand-over: a lease granted on one connection moves to another connection of its uid.

Real servers and real processes: a giver that exits after the take, a taker that reclaims
after SIGKILL and restart (and a giver that then cannot), refusals of every kind (a wrong,
reused or foreign ticket, another real Unix user, another connection's lease, a giver gone),
a time limit kept across the hand-over, and the per-request labels a supervisor gives its
jobs (``name``/``command`` of one ``acquire``), as ``hwpool status --json`` shows them.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hwpool
from hostserver import BOUND, ClientProc, Server, run_cli, status_of
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from hwpool._server._journal import journal_path
from rawpeers import Pair, Peer, acquire, connect_as, hello

StartServer = Callable[..., Server]
Clients = Callable[..., ClientProc]
FULL = UNITS_PER_GPU
NOT_OFFERED = "no lease of yours is offered with this ticket"


def give(req: int, ident: int) -> dict[str, object]:
    return {"op": "give", "req": req, "id": ident}


def take(req: int, ident: int, ticket: str) -> dict[str, object]:
    return {"op": "take", "req": req, "id": ident, "ticket": ticket}


def release(req: int, of: int) -> dict[str, object]:
    return {"op": "release", "req": req, "of": of}


@pytest.fixture
def open_peer(peers: list[Peer]) -> Iterator[Callable[..., Peer]]:
    """``open_peer(path, token=None, role=None, sock=None)``: a raw connection, hello sent."""

    def start(
        path: Path, token: str | None = None, role: str | None = None,
        sock: socket.socket | None = None,
    ) -> Peer:  # fmt: skip
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(BOUND)
            sock.connect(str(path))
        peer = Peer(sock)
        peers.append(peer)
        peer.send(hello(token or secrets.token_hex(16), role))
        return peer

    yield start


def offered(peer: Peer, req: int = 1) -> tuple[int, str]:
    """Have ``peer`` take one whole GPU (request ``req``) and give it: its id and ticket."""
    peer.send(acquire(req))
    granted = peer.answer(req)
    assert granted["op"] == "granted", granted
    peer.send(give(req + 1, granted["id"]))
    given = peer.answer(req + 1)
    assert given == {"op": "given", "req": req + 1, "id": granted["id"], "ticket": given["ticket"]}
    return granted["id"], given["ticket"]


def holders(path: Path) -> list[tuple[int, int]]:
    """``(id, pid)`` of every lease, as ``hwpool status --json`` shows them."""
    return [(x["id"], x["pid"]) for x in status_of(path)["leases"]]


def restart(server: Server, start_server: StartServer, *args: str) -> Server:
    """SIGKILL ``server`` (its journal brought up to date first) and start it again."""
    status_of(server.socket)  # status is a sync point: the journal is on disk
    server.proc.kill()
    server.proc.wait(BOUND)
    return start_server(*args, socket=server.socket)


# ----------------------------------------------------------------- between two processes
def test_a_lease_handed_over_outlives_its_giver_and_its_takers_release_frees_it(
    start_server: StartServer, clients: Clients
) -> None:
    server = start_server("--gpus", "1")
    giver = clients(server.socket)
    giver.send("full a 1")
    giver.expect("granted a [0]")
    giver.send("give a")
    _, _, ident, ticket = giver.expect("given a ").split()
    taker = clients(server.socket)
    taker.send(f"take b {ident} {ticket}")
    assert taker.expect("granted b") == "granted b [0]"
    server.wait_for(f"hand over #{ident} from root (uid 0) pid {giver.pid} to root (uid 0) "
                    f"pid {taker.pid}: GPU 0")  # fmt: skip
    giver.send("exit")
    giver.expect("bye")
    assert giver.proc.wait(BOUND) == 0
    assert holders(server.socket) == [(int(ident), taker.pid)]  # the giver's exit freed nothing
    other = clients(server.socket)
    other.send("full c 1")
    server.wait_for(f"pid {other.pid}: 1 whole GPU")  # it waits: the GPU is the taker's
    assert [w["pid"] for w in status_of(server.socket)["waiting"]] == [other.pid]
    taker.send("release b")
    taker.expect("released b")
    assert other.expect("granted c") == "granted c [0]"


def test_the_taker_reclaims_after_a_restart_and_the_giver_cannot(
    start_server: StartServer, clients: Clients, open_peer: Callable[..., Peer]
) -> None:
    args = ("--gpus", "1", "--grace", "30")
    server = start_server(*args)
    token = secrets.token_hex(16)
    ident, ticket = offered(open_peer(server.socket, token))
    taker = clients(server.socket, "30")
    taker.send(f"take b {ident} {ticket}")
    taker.expect("granted b [0]")
    records = [json.loads(line) for line in journal_path(server.socket).read_text().splitlines()]
    last = [r for r in records if r.get("id") == ident][-1]
    assert (last["op"], last["pid"]) == ("granted", taker.pid)  # journaled under its new holder
    assert last["token"] not in ("", token)  # the taker's token, not the giver's

    os.kill(taker.pid, signal.SIGSTOP)  # alive, but it cannot reclaim yet
    try:
        again = restart(server, start_server, *args)
        again.wait_for("recovering: 1 journaled")
        giver = open_peer(server.socket, token)  # the giver's own token: still not its lease
        giver.send({"op": "reclaim", "req": 1, "id": ident, "count": 1, "units": FULL,
                    "held": [[0, FULL]], "age_s": 1.0})  # fmt: skip
        refused = giver.answer(1)
        assert refused["code"] == "forbidden" and f"#{ident}" in refused["message"], refused
        assert status_of(server.socket)["leases"] == []
    finally:
        os.kill(taker.pid, signal.SIGCONT)
    again.wait_for(f"reclaim #{ident} by root (uid 0) pid {taker.pid}")
    again.wait_for("recovery over")
    assert holders(server.socket) == [(ident, taker.pid)]
    taker.send("release b")
    taker.expect("released b")
    assert [g["free"] for g in status_of(server.socket)["gpus"]] == [1.0]


# ----------------------------------------------------------------- refusals
def test_a_wrong_ticket_is_refused_and_the_lease_stays_offered(
    start_server: StartServer, open_peer: Callable[..., Peer]
) -> None:
    server = start_server("--gpus", "1")
    giver = open_peer(server.socket)
    ident, ticket = offered(giver)
    taker = open_peer(server.socket)
    wrong = secrets.token_urlsafe(24)
    taker.send(take(1, ident, wrong))
    refused = taker.answer(1)
    assert refused["code"] == "not_found" and NOT_OFFERED in refused["message"], refused
    taker.send(take(2, ident + 1000, ticket))  # no such lease: the same words
    unknown = taker.answer(2)
    assert unknown["message"] == refused["message"].replace(f"#{ident}", f"#{ident + 1000}")
    taker.send(release(3, 1))  # the refused take holds nothing
    assert taker.answer(3)["code"] == "not_found"
    assert holders(server.socket) == [(ident, os.getpid())]  # still held, still offered
    taker.send(take(4, ident, ticket))  # the right ticket still takes it
    assert taker.answer(4)["op"] == "granted"


def test_a_ticket_is_used_once_and_the_giver_then_holds_nothing(
    start_server: StartServer, open_peer: Callable[..., Peer]
) -> None:
    server = start_server("--gpus", "1")
    giver = open_peer(server.socket)
    ident, ticket = offered(giver)
    first, second = open_peer(server.socket), open_peer(server.socket)
    first.send(take(1, ident, ticket))
    granted = first.answer(1)
    assert (granted["op"], granted["id"], granted["gpus"], granted["units"]) == (
        "granted", ident, [0], FULL,
    )  # fmt: skip
    assert granted["request"] == {"count": 1, "units": FULL, "age_s": granted["request"]["age_s"]}
    second.send(take(1, ident, ticket))
    assert NOT_OFFERED in second.answer(1)["message"]
    giver.send(release(5, 1))  # the giver's release of it: an error, and nothing changes
    error = giver.answer(5)
    assert error["code"] == "not_found", error
    assert [x["id"] for x in status_of(server.socket)["leases"]] == [ident]
    giver.send(give(6, ident))  # nor may it give it again
    assert giver.answer(6)["code"] == "forbidden"
    first.send(release(2, 1), {"op": "status", "req": 3})
    assert first.answer(3)["free"] == [FULL]  # the taker's release frees it


def test_a_second_give_replaces_the_ticket(
    start_server: StartServer, open_peer: Callable[..., Peer]
) -> None:
    server = start_server("--gpus", "1")
    giver = open_peer(server.socket)
    ident, old = offered(giver)
    giver.send(give(3, ident))
    new = giver.answer(3)["ticket"]
    assert new != old
    taker = open_peer(server.socket)
    taker.send(take(1, ident, old))
    assert NOT_OFFERED in taker.answer(1)["message"]
    taker.send(take(2, ident, new))
    assert taker.answer(2)["op"] == "granted"


def test_giving_what_is_not_this_connections_lease_is_refused(
    start_server: StartServer, open_peer: Callable[..., Peer]
) -> None:
    server = start_server("--gpus", "1")
    holder, other = open_peer(server.socket), open_peer(server.socket)
    holder.send(acquire(1))
    ident = holder.answer(1)["id"]
    other.send(give(1, ident))
    forbidden = other.answer(1)
    assert forbidden["code"] == "forbidden" and "not this connection's" in forbidden["message"]
    other.send(give(2, ident + 1000))
    assert other.answer(2)["code"] == "not_found"
    other.send(acquire(3))  # waits behind the holder's lease
    other.send(give(4, ident + 1))
    waiter = other.answer(4)
    assert waiter["code"] == "bad_message" and "waiting, not granted" in waiter["message"]
    holder.send(release(2, 1) | {"gpu": 0, "units": FULL // 2}, give(3, ident))
    partly = holder.answer(3)
    assert partly["code"] == "bad_message" and "partly released" in partly["message"], partly
    control = open_peer(server.socket, role="control")
    control.send(give(1, ident))
    assert control.answer(1)["code"] == "forbidden"
    assert [x["id"] for x in status_of(server.socket)["leases"]] == [ident]


def test_a_lease_whose_giver_is_gone_cannot_be_taken(
    start_server: StartServer, open_peer: Callable[..., Peer]
) -> None:
    server = start_server("--gpus", "1")
    giver = open_peer(server.socket)
    ident, ticket = offered(giver)
    giver.close()  # before anyone took it: it is freed with the connection
    server.wait_for("gone: freed 1 lease")
    taker = open_peer(server.socket)
    taker.send(take(1, ident, ticket), {"op": "status", "req": 2})
    assert NOT_OFFERED in taker.answer(1)["message"]
    assert taker.answer(2)["free"] == [FULL]


def test_another_user_cannot_take_a_lease_even_with_its_ticket(
    start_server: StartServer, sockdir: Path, pair: Pair, open_peer: Callable[..., Peer]
) -> None:
    path = sockdir / "shared" / "s.sock"
    server = start_server("--gpus", "1", "--group", str(pair.gid), socket=path)
    os.chmod(sockdir, 0o711)  # the others may pass through to the shared directory
    alice = open_peer(path, sock=connect_as(pair.alice, pair.gid, path))
    ident, ticket = offered(alice)
    bob = open_peer(path, sock=connect_as(pair.bob, pair.gid, path))
    bob.send(take(1, ident, ticket))
    refused = bob.answer(1)
    bob.send(take(2, ident, secrets.token_urlsafe(24)))  # a wrong ticket reads the same
    assert refused["code"] == "not_found" and refused == {**bob.answer(2), "req": 1}
    assert [(x["id"], x["uid"]) for x in status_of(path)["leases"]] == [(ident, pair.alice)]
    again = open_peer(path, sock=connect_as(pair.alice, pair.gid, path))
    again.send(take(1, ident, ticket))  # the ticket was not used up: alice may still take it
    assert again.answer(1)["op"] == "granted"
    assert server.wait_for(f"hand over #{ident}")


# ----------------------------------------------------------------- a time limit
def test_a_lease_keeps_its_time_limit_end_when_handed_over(
    start_server: StartServer, open_peer: Callable[..., Peer]
) -> None:
    server = start_server("--gpus", "1")
    giver = open_peer(server.socket)
    giver.send(acquire(1) | {"limit_s": 6.0})
    ident = giver.answer(1)["id"]
    status_of(server.socket)  # the journal is on disk
    journal = journal_path(server.socket)

    def limit_end() -> tuple[float, str]:
        records = [json.loads(line) for line in journal.read_text().splitlines()]
        last = [r for r in records if r.get("id") == ident][-1]
        return last["limit_end"], last["token"]

    end, giver_token = limit_end()
    giver.send(give(2, ident))
    ticket = giver.answer(2)["ticket"]
    taker = open_peer(server.socket)
    taker.send(take(1, ident, ticket))
    granted = taker.answer(1)
    assert granted["request"]["limit_s"] == 6.0
    status_of(server.socket)
    assert limit_end()[0] == end and limit_end()[1] != giver_token  # the same end, a new holder
    taker.sock.settimeout(BOUND)
    revoked: list[dict[str, Any]] = []
    while not any(r["op"] == "revoked" for r in revoked):  # the taker is told, at the old end
        revoked += [json.loads(x) for x in taker.sock.recv(65536).splitlines() if x]
    notice = next(r for r in revoked if r["op"] == "revoked")
    assert (notice["req"], notice["id"], notice["reason"]) == (1, ident, "limit")


# ----------------------------------------------------------------- the client library
def test_the_backend_gives_and_takes_and_forgets_what_it_gave(start_server: StartServer) -> None:
    server = start_server("--gpus", "1")
    giver, taker = UnixBackend(server.socket), UnixBackend(server.socket)
    try:
        grant = giver.acquire_blocking(Demand(1, FULL // 2, limit=60.0), BOUND)
        ident = giver.lease_id(grant.ticket)
        assert ident is not None
        ticket = giver.give(grant)
        with pytest.raises(ValueError, match=rf"lease #{ident} .*handed over"):
            giver.release(grant)
        with pytest.raises(ValueError, match="handed over already"):
            giver.give(grant)
        with pytest.raises(ValueError, match="refused the take"):
            taker.take(ident, secrets.token_urlsafe(24))
        taken = taker.take(ident, ticket)
        assert (taken.gpus, taken.units, taker.lease_id(taken.ticket)) == ((0,), FULL // 2, ident)
        assert taker.demand_of(taken.ticket) == Demand(1, FULL // 2, limit=60.0)
        giver.close()  # its connection goes: the lease is the taker's, nothing is freed
        assert holders(server.socket) == [(ident, os.getpid())]
        assert not taker.revoked(taken.ticket)
        taker.release(taken)
        assert status_of(server.socket)["leases"] == []
    finally:
        giver.close()
        taker.close()


@pytest.mark.parametrize(
    ("lease_id", "ticket", "error", "words"),
    [
        (0, "a" * 32, ValueError, "lease_id"),
        ("1", "a" * 32, TypeError, "lease_id"),
        (True, "a" * 32, TypeError, "lease_id"),
        (1, "short", ValueError, "ticket must be .* got 'short'"),
        (1, "a" * 31 + "!", ValueError, "ticket must be"),
        (1, None, ValueError, "ticket must be .* got None"),
    ],
)
def test_bad_arguments_to_take_over_are_refused_naming_them(
    start_server: StartServer, lease_id: object, ticket: object, error: type, words: str
) -> None:
    server = start_server("--gpus", "1")
    with hwpool.connect(server.socket) as pool, pytest.raises(error, match=words):
        pool.take_over(lease_id, ticket)  # type: ignore[arg-type]


def test_a_gpu_lease_is_handed_over_to_another_pool(start_server: StartServer) -> None:
    server = start_server("--gpus", "2")
    with hwpool.connect(server.socket) as pool, hwpool.connect(server.socket) as other:
        lease = pool.lease(0.5, limit_s=120.0)
        with pytest.raises(RuntimeError, match="holds no GPU"):
            lease.hand_over()
        assert lease.id is None
        with lease as gpus:
            ident = lease.id
            assert ident == status_of(server.socket)["leases"][0]["id"]
            ticket = lease.hand_over()
            assert (lease.gpus, lease.id) == ([], None)
        assert holders(server.socket) == [(ident, os.getpid())]  # the block freed nothing
        taken = other.take_over(ident, ticket)
        assert (taken.gpus, taken.fraction, taken.id, taken.limit_s) == (gpus, 0.5, ident, 120.0)
        assert not taken.revoked and taken.memory_mib is None
        assert json.loads(taken.env()["HWPOOL_LEASE"])["id"] == ident
        assert taken.devices == [str(gpus[0])]
        with taken as inside:
            assert inside == gpus == hwpool.current_gpus()
        assert status_of(server.socket)["leases"] == []
        with pytest.raises(RuntimeError, match="entered only once"):
            taken.__enter__()


def test_an_in_process_pool_neither_hands_over_nor_takes_over() -> None:
    pool = hwpool.GPUPool(2)
    lease = pool.lease(0.5)
    with lease:
        with pytest.raises(TypeError, match=r"GPUPool\(num_gpus=2\) is an in-process pool"):
            lease.hand_over()
        assert lease.id is None and lease.gpus == [0]
    assert pool.snapshot().free == (1.0, 1.0)
    with pytest.raises(TypeError, match=r"take_over\(lease_id=3.*in-process pool"):
        pool.take_over(3, "a" * 32)


# ----------------------------------------------------------------- labels per request
def test_each_request_may_carry_its_own_name_and_command(start_server: StartServer) -> None:
    args = ("--gpus", "2", "--grace", "30")
    server = start_server(*args)
    backend = UnixBackend(server.socket, name="supervisor", command="hwpool supervise")
    try:
        backend.acquire_blocking(Demand(1, FULL), BOUND, name="j3 train.py",
                                 command="python train.py --lr 3")  # fmt: skip
        asyncio.run(backend.acquire(Demand(1, FULL), BOUND, name="j4 eval.py"))
        ended: list[BaseException] = []

        def wait() -> None:
            try:
                backend.acquire_blocking(Demand(1, FULL), BOUND, name="j5 plot.py",
                                         command="python plot.py")  # fmt: skip
            except hwpool.PoolClosedError as exc:  # the close at the end of the test
                ended.append(exc)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        server.wait_for('wait #3 "j5 plot.py"')
        seen = status_of(server.socket)
        assert [(x["name"], x["command"]) for x in seen["leases"]] == [
            ("j3 train.py", "python train.py --lr 3"), ("j4 eval.py", "hwpool supervise"),
        ]  # fmt: skip
        assert [(x["name"], x["command"]) for x in seen["waiting"]] == [
            ("j5 plot.py", "python plot.py")
        ]
        again = restart(server, start_server, *args)  # re-declared with their own labels
        again.wait_for("recovery over")
        seen = status_of(server.socket)
        assert [x["name"] for x in seen["leases"]] == ["j3 train.py", "j4 eval.py"]
        assert [x["name"] for x in seen["waiting"]] == ["j5 plot.py"]
        with pytest.raises(TypeError, match="name must be a string"):
            backend.acquire_blocking(Demand(1, FULL), 0, name=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="command must be at most 4096"):
            backend.acquire_blocking(Demand(1, FULL), 0, command="x" * 4097)
    finally:
        backend.close()
    waiter.join(BOUND)
    assert ended and not waiter.is_alive()


def test_a_lease_taken_over_is_revoked_like_any_other(start_server: StartServer) -> None:
    server = start_server("--gpus", "1")
    with hwpool.connect(server.socket) as pool, hwpool.connect(server.socket) as other:
        pool_lease = pool.lease(1.0)

        async def enter_handed() -> tuple[int | None, str]:
            async with pool_lease:
                return pool_lease.id, pool_lease.hand_over()

        ident, ticket = asyncio.run(enter_handed())
        assert ident is not None
        taken = other.take_over(ident, ticket)

        async def use() -> list[int]:
            async with taken as gpus:
                code, _, err = run_cli("cancel", "--socket", str(server.socket), str(ident))
                assert code == 0, err
                deadline = time.monotonic() + BOUND
                while not taken.revoked:  # the server's revoked, read by the taker's reader
                    assert time.monotonic() < deadline, "never revoked"
                    await asyncio.sleep(0.01)
                return gpus

        assert asyncio.run(use()) == [0]  # its end released nothing: it was revoked
        assert taken.revoked and status_of(server.socket)["leases"] == []
