"""SIGKILL the server with leases held and waiters queued, start it again: nothing is lost.

The clients reconnect by themselves and reclaim; the restarted server grants nothing new
until every live client the journal names has reclaimed (or the grace period ends); leases
keep their ids, waiters their order, and what clients that died meanwhile held comes back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable

from hostserver import BOUND, ClientProc, Server, status_of
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from hwpool._server import _journal

StartServer = Callable[..., Server]
Clients = Callable[..., ClientProc]
FULL = UNITS_PER_GPU


status = status_of


def leases(report: dict[str, object]) -> list[tuple[int, int, list[list[float]]]]:
    return [(x["id"], x["pid"], x["held"]) for x in report["leases"]]  # type: ignore[attr-defined]


def queue(report: dict[str, object]) -> list[tuple[int, int]]:
    return [(w["id"], w["pid"]) for w in report["waiting"]]  # type: ignore[attr-defined]


class Host:
    """Two GPUs, full: four leases (three client processes and this one), two waiters."""

    def __init__(self, server: Server, clients: Clients) -> None:
        path = server.socket
        self.holder, self.doomed, self.sleeper, self.first, self.second = (
            clients(path) for _ in range(5)
        )
        self.holder.send("full h 1")
        assert self.holder.expect("granted h") == "granted h [0]"
        self.mine = UnixBackend(path)
        self.my_grant = self.mine.acquire_blocking(Demand(1, FULL // 2), BOUND)
        for proc, name in ((self.doomed, "d"), (self.sleeper, "s")):
            proc.send(f"acquire {name} 0.25")
            proc.expect(f"granted {name}")
        self.first.send("full w 2")
        server.wait_for(f"pid {self.first.pid}: 2 whole GPUs")
        self.second.send("acquire v 0.5")
        server.wait_for(f"pid {self.second.pid}: 0.5 of a GPU")


def test_sigkill_and_restart_loses_no_lease_and_no_place_in_the_queue(
    start_server: StartServer, clients: Clients
) -> None:
    args = ("--gpus", "2", "--grace", "8")
    server = start_server(*args)
    path = server.socket
    host = Host(server, clients)
    holder, doomed, sleeper, first, second = (
        host.holder, host.doomed, host.sleeper, host.first, host.second
    )  # fmt: skip
    before = status(path)  # also a sync point: the journal is now up to date
    assert [pid for _, pid in queue(before)] == [first.pid, second.pid]

    server.proc.kill()
    server.proc.wait(BOUND)
    os.kill(sleeper.pid, signal.SIGSTOP)  # alive, but it cannot reclaim yet
    doomed.kill()  # dies while no server runs
    journal = _journal.load(_journal.journal_path(path))
    assert journal is not None and len(journal.entries) == 6

    again = start_server(*args)
    again.wait_for("recovering: 6 journaled")
    for ident, pid, _ in leases(before):
        if pid not in (doomed.pid, sleeper.pid):
            again.wait_for(f"reclaim #{ident} by root (uid 0) pid {pid}")
    newcomer = clients(path)
    newcomer.send("acquire n 0.25")
    again.wait_for(f"pid {newcomer.pid}: 0.25 of a GPU (held back while recovering)")
    during = status(path)
    assert during["server"]["recovering_s"] > 0  # type: ignore[index]
    kept = [x for x in leases(before) if x[1] not in (doomed.pid, sleeper.pid)]
    assert leases(during) == kept  # the same ids, the same GPUs
    assert queue(during)[:2] == queue(before)  # the same ids, the same order
    assert queue(during)[2][1] == newcomer.pid  # held back, behind them
    assert during["gpus"][1]["free"] == 0.5  # type: ignore[index]  # nothing new granted

    os.kill(sleeper.pid, signal.SIGCONT)
    again.wait_for("recovery over")
    after = status(path)
    assert after["server"]["recovering_s"] == 0  # type: ignore[index]
    assert [pid for _, pid, _ in leases(after)] == [holder.pid, os.getpid(), sleeper.pid]
    assert [g["free"] for g in after["gpus"]] == [0.0, 0.25]  # type: ignore[index]  # the dead one's
    assert [pid for _, pid in queue(after)] == [first.pid, second.pid, newcomer.pid]

    # The queue goes on in its old order: the 2-GPU waiter first, once both GPUs are free.
    holder.send("release h")
    holder.expect("released h")
    host.mine.release(host.my_grant)
    sleeper.send("release s")
    sleeper.expect("released s")
    assert first.expect("granted w") == "granted w [0, 1]"
    first.send("release w")
    assert second.expect("granted v").startswith("granted v")
    assert newcomer.expect("granted n").startswith("granted n")
    host.mine.close()


def test_a_restart_with_every_client_dead_serves_at_once(
    start_server: StartServer, clients: Clients
) -> None:
    server = start_server("--gpus", "1", "--grace", "30")
    holder = clients(server.socket)
    holder.send("full h 1")
    holder.expect("granted h")
    status(server.socket)
    server.proc.kill()
    server.proc.wait(BOUND)
    holder.kill()
    again = start_server("--gpus", "1", "--grace", "30")
    again.wait_for("1 of dead ones freed")
    again.wait_for("recovery over")
    backend = UnixBackend(again.socket)
    backend.release(backend.acquire_blocking(Demand(1, FULL), BOUND))
    backend.close()


def test_a_sigterm_restart_is_recovered_the_same_way(
    start_server: StartServer, clients: Clients
) -> None:
    server = start_server("--gpus", "1", "--grace", "8")
    holder = clients(server.socket)
    holder.send("full h 1")
    holder.expect("granted h")
    ident = leases(status(server.socket))[0][0]
    assert server.stop(signal.SIGTERM) == 0
    again = start_server("--gpus", "1", "--grace", "8")
    again.wait_for(f"reclaim #{ident} by root (uid 0) pid {holder.pid}")
    again.wait_for("recovery over")
    assert leases(status(again.socket))[0][:2] == (ident, holder.pid)


def test_async_and_blocking_waiters_of_one_process_keep_their_order_over_a_restart(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1", "--grace", "8")
    backend = UnixBackend(server.socket)
    order: list[str] = []
    held = backend.acquire_blocking(Demand(1, FULL), BOUND)

    def blocking() -> None:
        grant = backend.acquire_blocking(Demand(1, FULL), BOUND * 2)
        order.append("thread")  # recorded while it holds the GPU, so before the next grant
        backend.release(grant)

    async def main() -> None:
        task = asyncio.create_task(backend.acquire(Demand(1, FULL), BOUND * 2))
        await asyncio.to_thread(server.wait_for, f"pid {os.getpid()}: 1 whole GPU")
        thread = threading.Thread(target=blocking)
        thread.start()
        await asyncio.to_thread(server.wait_for, "wait #3")
        status(server.socket)  # the journal is up to date
        server.proc.kill()
        server.proc.wait(BOUND)
        again = start_server("--gpus", "1", "--grace", "8")
        await asyncio.to_thread(again.wait_for, "recovery over")
        backend.release(held)  # the lease survived: its release frees the GPU
        grant = await task
        order.append("task")  # before its release lets the thread's request be granted
        backend.release(grant)
        await asyncio.to_thread(thread.join, BOUND)

    asyncio.run(main())
    assert order == ["task", "thread"]
    backend.close()


def test_a_reclaimed_lease_keeps_its_time_limit_end(start_server: StartServer) -> None:
    """A lease with a time limit keeps the end its journal records across a SIGKILL: the
    restarted server revokes it then (not later, for the outage; not from the client's
    word), and one whose limit is long keeps exactly its journaled end."""
    args = ("--gpus", "2", "--grace", "8")
    server = start_server(*args)
    path = server.socket
    mine = UnixBackend(path)
    short = mine.acquire_blocking(Demand(1, FULL, limit=3.0), BOUND)
    long = mine.acquire_blocking(Demand(1, FULL, limit=3600.0), BOUND)
    status(path)  # a sync point: the journal is up to date
    server.proc.kill()
    server.proc.wait(BOUND)
    journal = _journal.load(_journal.journal_path(path))
    assert journal is not None
    ends = {e.held: e.limit_end for e in journal.entries}
    assert len(ends) == 2 and all(end is not None for end in ends.values())

    again = start_server(*args)
    again.wait_for("recovery over")
    line = again.wait_for("its time limit ran out")  # the short one, by its journaled end
    assert f"#{mine.lease_id(long.ticket)}" not in line
    revoked = threading.Event()
    for _ in range(int(BOUND / 0.01)):  # the client hears of it (bounded)
        if mine.revoked(short.ticket):
            revoked.set()
            break
        revoked.wait(0.01)
    assert revoked.is_set() and not mine.revoked(long.ticket)
    status(path)
    rewritten = _journal.load(_journal.journal_path(path))
    assert rewritten is not None
    (kept,) = rewritten.entries
    assert kept.limit_end == ends[kept.held]  # exactly the journaled end
    mine.release(short)  # revoked: a no-op
    mine.release(long)
    mine.close()


def test_a_recovered_lease_counts_in_its_owners_usage_from_its_real_start(
    start_server: StartServer,
) -> None:
    """A restart credited a recovered lease with the usage of a lease held since the boot
    (thousands of GPU-seconds); its owner's usage is what it really held."""
    args = ("--gpus", "1", "--grace", "30")
    server = start_server(*args)
    path = server.socket
    began = time.monotonic()
    mine = UnixBackend(path)
    mine.acquire_blocking(Demand(1, FULL), BOUND)
    for _ in range(int(BOUND / 0.05)):  # held a second, by the server's own account
        held_s = status(path)["leases"][0]["held_s"]
        if held_s >= 1.0:
            break
        threading.Event().wait(0.05)
    assert held_s >= 1.0
    server.proc.kill()  # the status above is a sync point: the journal is on disk
    server.proc.wait(BOUND)
    again = start_server(*args)
    again.wait_for("recovery over")
    (owner,) = [o for o in status(path)["owners"] if o["uid"] == os.getuid()]
    held_in_all = time.monotonic() - began
    assert held_s <= owner["usage_gpu_s"] <= held_in_all  # not from 0, not from the restart
    mine.close()
