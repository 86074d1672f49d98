"""What the journal guarantees, against real ``hwpool serve`` processes.

- Write-ahead: a grant a client has received is in the journal, however soon the server is
  SIGKILLed after it; the restarted server keeps that GPU for its holder.
- A full disk: nothing new is granted until the journal can be written (said in the log and
  by ``hwpool status``); the grant goes out once it can.
- Ids are never shown twice, even when the journal is deleted, emptied or garbage.
- The journal is appended to, not rewritten, as the queue grows.
- A planned stop grants nothing it cannot deliver; the counters go on across restarts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from test_server_robust import one_reply, welcomed

from hostserver import BOUND, ClientProc, Server, fill, run_cli, status_of
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from hwpool._server import _journal
from hwpool._wire._protocol import Acquire, encode

StartServer = Callable[..., Server]
Clients = Callable[..., ClientProc]
FULL = UNITS_PER_GPU


def journaled(server: Server) -> _journal.Journal:
    journal = _journal.load(_journal.journal_path(server.socket))
    assert journal is not None
    return journal


def kill(server: Server) -> None:
    server.proc.kill()
    server.proc.wait(BOUND)


def test_a_grant_is_journaled_before_its_reply_reaches_the_client(
    start_server: StartServer, clients: Clients
) -> None:
    args = ("--gpus", "1", "--grace", "8")
    server = start_server(*args)
    mine = UnixBackend(server.socket)
    mine.release(mine.acquire_blocking(Demand(1, FULL), BOUND))  # the first block of ids
    assert not status_of(server.socket)["leases"]  # (the released lease is gone)
    grant = mine.acquire_blocking(Demand(1, FULL), BOUND)
    kill(server)  # at once: a journal written after the reply would not have it yet
    [entry] = journaled(server).entries
    assert (entry.pid, entry.held) == (os.getpid(), ((0, FULL),))

    again = start_server(*args)
    again.wait_for("recovering: 1 journaled")
    again.wait_for(f"reclaim #{entry.id} by root (uid 0) pid {os.getpid()}")
    again.wait_for("recovery over")
    other = clients(again.socket)
    other.send("full o 1")
    again.wait_for(f"pid {other.pid}: 1 whole GPU")
    report = status_of(again.socket)
    assert [(x["id"], x["pid"]) for x in report["leases"]] == [(entry.id, os.getpid())]
    assert [w["pid"] for w in report["waiting"]] == [other.pid]  # the GPU stays ours
    mine.release(grant)
    assert other.expect("granted o") == "granted o [0]"
    mine.close()


def test_a_full_disk_holds_grants_back_until_the_journal_is_written(
    start_server: StartServer, small_disk: Path
) -> None:
    server = start_server("--gpus", "1", socket=small_disk / "s.sock")
    filler = fill(small_disk)
    sock = welcomed(server.socket)
    sock.sendall(encode(Acquire(1, 1, FULL, True)))
    line = server.wait_for("cannot write the journal")
    assert "No space left on device" in line and "nothing new is granted" in line
    report = status_of(server.socket)  # status is answered meanwhile, and says why
    assert "No space left on device" in report["server"]["journal_error"]
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):  # the grant was decided, but not sent
        sock.recv(65536)
    assert not journaled(server).entries

    filler.unlink()
    sock.settimeout(BOUND)
    assert one_reply(sock)["op"] == "granted"
    server.wait_for("the journal is written again")
    assert status_of(server.socket)["server"]["journal_error"] is None
    assert [e.held for e in journaled(server).entries] == [((0, FULL),)]
    sock.close()


def test_status_text_says_when_the_journal_cannot_be_written(
    start_server: StartServer, small_disk: Path
) -> None:
    server = start_server("--gpus", "1", socket=small_disk / "s.sock")
    fill(small_disk)
    sock = welcomed(server.socket)
    sock.sendall(encode(Acquire(1, 1, FULL, True)))
    server.wait_for("cannot write the journal")
    code, out, _ = run_cli("status", "--socket", str(server.socket))
    assert code == 0
    [line] = [x for x in out.splitlines() if x.startswith("journal not writable")]
    assert "nothing new is granted" in line and "No space left on device" in line
    sock.close()


@pytest.mark.parametrize("damage", ["deleted", "emptied", "garbage"])
def test_ids_are_never_shown_twice_even_after_a_lost_journal(
    start_server: StartServer, clients: Clients, damage: str
) -> None:
    args = ("--gpus", "1", "--grace", "0.5")
    server = start_server(*args)
    holder = clients(server.socket)
    for name in "abc":
        holder.send(f"acquire {name} 0.25")
        holder.expect(f"granted {name}")
    shown = {x["id"] for x in status_of(server.socket)["leases"]}
    kill(server)
    holder.kill()
    path = _journal.journal_path(server.socket)
    if damage == "deleted":
        path.unlink()
    else:
        path.write_bytes(b"" if damage == "emptied" else b"\x00garbage\n")
    again = start_server(*args)
    backend = UnixBackend(again.socket)
    backend.acquire_blocking(Demand(1, FULL // 4), BOUND)
    [new] = [x["id"] for x in status_of(again.socket)["leases"]]
    assert new > max(shown)
    backend.close()


def test_the_journal_is_appended_to_as_the_queue_grows(start_server: StartServer) -> None:
    server = start_server("--gpus", "1", "--max-requests-per-connection", "2000")
    sock = welcomed(server.socket)
    sock.sendall(encode(Acquire(1, 1, FULL, True)))
    assert one_reply(sock)["op"] == "granted"
    path = _journal.journal_path(server.socket)
    inode = path.stat().st_ino
    waiters = 1500  # past a block of ids: it used to rewrite the whole journal then
    sock.sendall(b"".join(encode(Acquire(req, 1, FULL, True)) for req in range(2, 2 + waiters)))
    replies = read_lines(sock, waiters)
    assert {r["op"] for r in replies} == {"queued"}
    assert path.stat().st_ino == inode  # never replaced, only appended to
    journal = journaled(server)
    assert len(journal.entries) == 1 + waiters
    assert journal.id_limit > max(r["id"] for r in replies)  # type: ignore[type-var]
    sock.close()


def read_lines(sock: socket.socket, count: int) -> list[dict[str, object]]:
    data = b""
    while data.count(b"\n") < count:
        chunk = sock.recv(1 << 20)
        assert chunk, "closed"
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_a_planned_stop_grants_nothing_it_cannot_deliver(
    start_server: StartServer, clients: Clients
) -> None:
    server = start_server("--gpus", "1", "--grace", "8")
    holder, waiter = clients(server.socket), clients(server.socket)
    holder.send("full h 1")
    holder.expect("granted h")
    waiter.send("full w 1")
    server.wait_for(f"pid {waiter.pid}: 1 whole GPU")
    assert server.stop(signal.SIGTERM) == 0
    server.wait_for("stopped")
    grants = [line for line in server.lines if "grant #" in line]
    assert len(grants) == 1 and f"pid {holder.pid}" in grants[0]
    assert not [line for line in server.lines if "gone: freed" in line]
    journal = journaled(server)
    assert [(e.pid, e.held is not None) for e in journal.entries] == [
        (holder.pid, True),
        (waiter.pid, False),
    ]


@pytest.mark.parametrize("released_b_first", [True, False])
def test_the_counters_go_on_across_a_restart(
    start_server: StartServer, clients: Clients, released_b_first: bool
) -> None:
    args = ("--gpus", "1", "--grace", "8")
    server = start_server(*args)
    holder = clients(server.socket)
    holder.send("acquire a 0.5")
    holder.expect("granted a")
    holder.send("acquire b 0.25")
    holder.expect("granted b")
    holder.send("release b")
    holder.expect("released b")
    if released_b_first:  # else it may or may not reach the server before the SIGKILL
        server.wait_for("release #2")
    kill(server)
    again = start_server(*args)
    again.wait_for("recovery over")  # b, if still journaled, is freed: counted as released
    holder.send("release a")
    holder.expect("released a")
    again.wait_for("release #1")
    counters = status_of(again.socket)["counters"]
    assert (counters["granted"], counters["released"]) == (2, 2)


@pytest.mark.parametrize("planted", ["another user's", "group-writable", "a symlink"])
def test_a_planted_journal_is_not_loaded(
    start_server: StartServer, sockdir: Path, planted: str
) -> None:
    """Item 10: a journal someone else could have written (one promising ids near 2**53, and
    a lease that would hold the GPU) is refused by name, and nothing of it is believed."""
    path = _journal.journal_path(sockdir / "s.sock")
    lines = [
        {"format": "hwpool-journal", "version": 2, "server_pid": 1},
        {"op": "ids", "limit": 2**52},
        {"op": "granted", "id": 7, "uid": 0, "pid": 1, "count": 1, "units": FULL,
         "held": [[0, FULL]], "token": ""},
    ]  # fmt: skip
    text = "".join(json.dumps(line) + "\n" for line in lines)
    target = sockdir / "elsewhere"
    (target if planted == "a symlink" else path).write_text(text)
    if planted == "another user's":
        os.chown(path, 54321, 54321)
    elif planted == "group-writable":
        path.chmod(0o620)
    else:
        path.symlink_to(target)
    if os.geteuid() != 0 and planted == "another user's":
        pytest.skip("chown to another uid needs root")
    server = start_server("--gpus", "1", "--grace", "0.2", socket=sockdir / "s.sock")
    server.wait_for("cannot read the journal")
    backend = UnixBackend(server.socket)
    backend.acquire_blocking(Demand(1, FULL), BOUND)  # the planted lease holds nothing
    [lease] = status_of(server.socket)["leases"]
    assert lease["id"] < 2**20  # the planted id limit was not believed
    backend.close()
