"""Several client processes share one real server: FIFO with reservations, crashes, cancel."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hwpool
from hostserver import BOUND, ENV, ClientProc, Server, run_cli, status_of
from hwpool import UNITS_PER_GPU, GPUInfo, GPUPool, PoolClosedError, RevokedError, current_gpus
from hwpool._backends._unix import UnixBackend
from hwpool._core._scheduler import Demand
from hwpool._wire._connection import Wire
from hwpool._wire._protocol import LeaseRecord, Status, StatusReply, Welcome, encode

StartServer = Callable[..., Server]
Clients = Callable[..., ClientProc]
FULL = UNITS_PER_GPU


def hwpool_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args],
        capture_output=True, text=True, env=ENV, timeout=BOUND, check=False,
    )  # fmt: skip


def status(server: Server) -> dict[str, Any]:
    return status_of(server.socket)


def queue_of(server: Server) -> list[tuple[int, int, list[int]]]:
    """(pid, count, reserved) of each waiter, in queue order."""
    waiting = status(server)["waiting"]
    assert isinstance(waiting, list)
    return [(w["pid"], w["count"], w["reserved"]) for w in waiting]


@pytest.fixture
def server(start_server: StartServer) -> Server:
    return start_server("--gpus", "2")


def test_connect_without_a_server_says_how_to_start_one(sockdir: Path) -> None:
    with pytest.raises(ConnectionError) as info:
        UnixBackend(sockdir / "none.sock")
    message = str(info.value)
    assert str(sockdir / "none.sock") in message and "hwpool serve" in message


def test_connect_returns_the_gpupool_front_over_the_server(server: Server) -> None:
    with hwpool.connect(server.socket) as pool:
        assert isinstance(pool, GPUPool) and pool.num_gpus == 2
        with pool.lease(0.5) as gpus:
            assert gpus == current_gpus() == [0]
            assert [x["held"] for x in status(server)["leases"]] == [[[0, 0.5]]]
        with pytest.raises(ValueError, match="fraction"):
            pool.lease(1.5)
    assert status(server)["leases"] == []


def test_gpupool_with_hwpool_socket_set_is_the_servers(
    server: Server, sockdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWPOOL_SOCKET", str(server.socket))
    with GPUPool() as pool, pool.lease_full(2):  # no change to the code: the host's queue
        assert len(status(server)["leases"]) == 1
    assert len(GPUPool(1).snapshot().free) == 1  # an explicit size stays in-process
    with hwpool.connect() as pool:  # the default socket is HWPOOL_SOCKET too
        assert pool.num_gpus == 2
    monkeypatch.setenv("HWPOOL_SOCKET", str(sockdir / "none.sock"))
    with pytest.raises(ConnectionError, match=r"none\.sock"):
        GPUPool()


def test_processes_share_one_fifo_queue_with_reservations(server: Server, clients: Clients) -> None:
    a, b, c = (clients(server.socket) for _ in range(3))
    a.send("acquire x 0.5")
    assert a.expect("granted x") == "granted x [0]"
    mark = len(server.lines)
    b.send("full y 2")
    server.wait_for(f"pid {b.pid}: 2 whole GPUs", mark)
    c.send("acquire z 0.25")  # GPU 1 is free, but b reserved it: c must not backfill there
    server.wait_for(f"pid {c.pid}: 0.25 of a GPU", mark)
    assert queue_of(server) == [(b.pid, 2, [0, 1]), (c.pid, 1, [])]
    a.send("release x")
    a.expect("released x")
    assert b.expect("granted y") == "granted y [0, 1]"
    assert queue_of(server) == [(c.pid, 1, [0])]  # now at the head, it reserves
    b.send("release y")
    assert c.expect("granted z") == "granted z [0]"


def test_sigkill_of_a_holder_frees_its_leases_at_once(server: Server, clients: Clients) -> None:
    holder = clients(server.socket)
    holder.send("full x 2")
    holder.expect("granted x")
    backend = UnixBackend(server.socket)
    got: list[object] = []
    waiter = threading.Thread(
        target=lambda: got.append(backend.acquire_blocking(Demand(2, FULL), BOUND))
    )
    waiter.start()
    server.wait_for(f"pid {os.getpid()}: 2 whole GPUs")
    holder.kill()
    waiter.join(BOUND)
    assert got and got[0].gpus == (0, 1)  # type: ignore[attr-defined]
    assert f"client root (uid 0) pid {holder.pid} gone: freed 1 lease" in server.wait_for("gone")
    backend.close()


def test_sigkill_of_a_waiter_withdraws_it(server: Server, clients: Clients) -> None:
    backend = UnixBackend(server.socket)
    grant = backend.acquire_blocking(Demand(2, FULL), BOUND)
    waiter = clients(server.socket)
    waiter.send("acquire x 0.5")
    server.wait_for(f"pid {waiter.pid}: 0.5 of a GPU")
    waiter.kill()
    assert "withdrew 1 waiter" in server.wait_for(f"pid {waiter.pid} gone")
    assert queue_of(server) == []
    backend.release(grant)
    assert backend.snapshot().free == (1.0, 1.0)
    backend.close()


def test_closing_the_pool_gives_everything_back_and_fails_its_waiters(server: Server) -> None:
    backend = UnixBackend(server.socket)
    backend.acquire_blocking(Demand(2, FULL), BOUND)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            backend.acquire_blocking(Demand(1, FULL), BOUND)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    server.wait_for(f"pid {os.getpid()}: 1 whole GPU")
    other = UnixBackend(server.socket)
    backend.close()  # returns once the server has freed everything (its "bye")
    assert other.snapshot().free == (1.0, 1.0) and other.snapshot().waiting == ()
    thread.join(BOUND)
    assert len(errors) == 1 and isinstance(errors[0], PoolClosedError)
    with pytest.raises(PoolClosedError):
        backend.acquire_now(Demand(1, 1))
    other.close()


def test_a_server_that_counts_capacity_otherwise_is_refused(sockdir: Path) -> None:
    path = sockdir / "odd.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()

    def serve_one() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        welcome = Welcome(1, "hwpool 9", 1, 0, 1000, (GPUInfo(0, "0"),), False)
        conn.sendall(encode(welcome))
        conn.recv(65536)  # until the client hangs up
        conn.close()

    thread = threading.Thread(target=serve_one)
    thread.start()
    with pytest.raises(ConnectionError, match="counts 1000 units per GPU"):
        UnixBackend(path)
    thread.join(BOUND)
    listener.close()


def test_one_connection_serves_many_threads_and_event_loops(server: Server) -> None:
    backend = UnixBackend(server.socket)
    rounds = 30

    def thread_work() -> None:
        for _ in range(rounds):
            backend.release(backend.acquire_blocking(Demand(1, FULL * 3 // 10), BOUND))

    async def task_work() -> None:
        for _ in range(rounds):
            backend.release(await backend.acquire(Demand(1, FULL * 4 // 10), BOUND))

    async def loop_work() -> None:
        await asyncio.gather(*(task_work() for _ in range(4)))

    workers = [threading.Thread(target=thread_work) for _ in range(4)]
    workers += [threading.Thread(target=asyncio.run, args=(loop_work(),)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(BOUND * 3)
    snap = backend.snapshot()
    assert snap.free == (1.0, 1.0) and snap.waiting == ()
    assert snap.granted == snap.released == 4 * rounds + 8 * rounds
    backend.close()


def test_cancelled_async_waiter_leaves_nothing_behind(server: Server) -> None:
    backend = UnixBackend(server.socket)

    async def main() -> None:
        grant = await backend.acquire(Demand(2, FULL), BOUND)
        task = asyncio.create_task(backend.acquire(Demand(1, FULL), None))
        await asyncio.to_thread(server.wait_for, f"pid {os.getpid()}: 1 whole GPU")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(TimeoutError):
            await backend.acquire(Demand(1, FULL), 0.05)
        backend.release(grant)

    asyncio.run(main())
    snap = backend.snapshot()
    assert snap.free == (1.0, 1.0) and snap.waiting == ()
    assert (snap.cancelled, snap.timed_out) == (1, 1)
    backend.close()


def test_a_grant_that_races_a_cancellation_is_given_back(server: Server) -> None:
    backend = UnixBackend(server.socket)

    async def main() -> None:
        grant = await backend.acquire(Demand(2, FULL), BOUND)
        task = asyncio.create_task(backend.acquire(Demand(1, FULL), None))
        await asyncio.to_thread(server.wait_for, f"pid {os.getpid()}: 1 whole GPU")
        mark = len(server.lines)
        backend.release(grant)  # the server grants the waiter at once...
        server.wait_for(f"pid {os.getpid()}: GPU 0", mark)  # (blocking: the task cannot run)
        task.cancel()  # ...but it is cancelled before the grant reaches it
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    snap = backend.snapshot()
    assert snap.free == (1.0, 1.0) and snap.waiting == ()
    assert snap.granted == snap.released and snap.cancelled == 1  # whether or not it arrived
    backend.close()


def test_a_forked_child_opens_its_own_connection(server: Server) -> None:
    backend = UnixBackend(server.socket)
    parent_grant = backend.acquire_blocking(Demand(1, FULL // 2), BOUND)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        try:
            backend.release(parent_grant)  # the parent's: a no-op here
            grant = backend.acquire_blocking(Demand(1, FULL // 2), 5.0)
            leases = {x.pid for x in _leases(backend)}
            backend.release(grant)
            os.write(write, json.dumps(sorted(leases)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read() or "null")
    os.waitpid(pid, 0)
    assert seen == sorted({os.getpid(), pid})
    snap = backend.snapshot()  # the parent's connection is intact, its lease still held
    assert snap.free == (0.5, 1.0)
    backend.release(parent_grant)
    backend.close()


def _leases(backend: UnixBackend) -> list[LeaseRecord]:
    wire = Wire(backend.socket)
    wire.send_bytes(encode(Status(1)))
    reply = wire.read()
    wire.shutdown()
    assert isinstance(reply, StatusReply)
    return list(reply.leases)


# ----------------------------------------------------------------- status and cancel
def test_status_shows_gpus_leases_and_the_queue(server: Server, clients: Clients) -> None:
    holder, waiter = clients(server.socket), clients(server.socket)
    holder.send("acquire x 0.5")
    holder.expect("granted x")
    waiter.send("full y 2")
    server.wait_for(f"pid {waiter.pid}: 2 whole GPUs")
    report = status(server)
    assert [g["free"] for g in report["gpus"]] == [0.5, 1.0]  # type: ignore[index]
    (lease,) = report["leases"]  # type: ignore[misc]
    assert lease["pid"] == holder.pid and lease["user"] == "root" and lease["held"] == [[0, 0.5]]
    (wait,) = report["waiting"]  # type: ignore[misc]
    assert (wait["position"], wait["pid"], wait["count"], wait["reserved"]) == (
        1, waiter.pid, 2, [0, 1],
    )  # fmt: skip
    text = hwpool_cmd("status", "--socket", str(server.socket))  # the real command, once
    assert text.returncode == 0
    assert f"#{lease['id']} root pid {holder.pid}: 0.5 of GPU 0" in text.stdout
    assert f"1. #{wait['id']} root pid {waiter.pid}: 2 whole GPUs, reserves GPU 0,1" in text.stdout


def test_cancel_revokes_a_lease_whose_release_becomes_a_no_op(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    backend = UnixBackend(server.socket)
    grant = backend.acquire_blocking(Demand(1, FULL), BOUND)
    lease_id = status(server)["leases"][0]["id"]  # type: ignore[index]
    mark = len(server.lines)
    with caplog.at_level(logging.WARNING, logger="hwpool"):
        proc = hwpool_cmd("cancel", str(lease_id), "--socket", str(server.socket))  # the real one
        assert proc.returncode == 0
        assert proc.stdout == (
            f"#{lease_id}: revoked the lease of root pid {os.getpid()}: its GPUs are free once "
            "its processes are gone\n"
        )
        server.wait_for(f"revoke #{lease_id}", mark)
        # The status is answered after the notice; no job of this process is proven to run,
        # so nothing is waited for: the GPU is free at once.
        assert backend.snapshot().free == (1.0, 1.0)
        server.wait_for(f"free GPU {grant.gpus[0]} of revoked #{lease_id}: no job", mark)
    assert any("revoked by root (uid 0)" in r.getMessage() for r in caplog.records)
    backend.release(grant)  # a no-op, not an error
    assert status(server)["leases"] == [] and backend.snapshot().free == (1.0, 1.0)
    backend.close()


def test_cancel_withdraws_a_waiter_which_raises(server: Server) -> None:
    backend = UnixBackend(server.socket)
    backend.acquire_blocking(Demand(2, FULL), BOUND)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            backend.acquire_blocking(Demand(1, FULL), BOUND)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    server.wait_for(f"pid {os.getpid()}: 1 whole GPU")
    waiter_id = status(server)["waiting"][0]["id"]  # type: ignore[index]
    assert run_cli("cancel", str(waiter_id), "--socket", str(server.socket))[0] == 0
    thread.join(BOUND)
    assert len(errors) == 1 and isinstance(errors[0], RevokedError)
    assert "hwpool cancel" in str(errors[0])
    backend.close()


def test_cancel_of_an_unknown_id_is_exit_2(server: Server) -> None:
    code, out, err = run_cli("cancel", "999", "--socket", str(server.socket))
    assert (code, out, err) == (2, "", "hwpool: error: no lease or waiter #999\n")


def test_status_without_a_server_is_exit_1(sockdir: Path) -> None:
    code, out, err = run_cli("status", "--socket", str(sockdir / "none.sock"))
    assert code == 1 and out == "" and "hwpool serve" in err and len(err.splitlines()) == 1


def test_a_server_that_goes_away_mid_wait_is_retried_then_raises(server: Server) -> None:
    backend = UnixBackend(server.socket, reconnect_timeout=0.3)
    backend.acquire_blocking(Demand(2, FULL), BOUND)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            backend.acquire_blocking(Demand(1, FULL), BOUND)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    server.wait_for(f"pid {os.getpid()}: 1 whole GPU")
    server.kill()
    thread.join(BOUND)
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)
    assert "reconnect_timeout=0.3s" in str(errors[0])
    with pytest.raises(ConnectionError, match="hwpool serve"):
        backend.acquire_now(Demand(1, 1))
    backend.close()


def test_an_async_waiter_whose_server_goes_away_raises_after_retrying(server: Server) -> None:
    backend = UnixBackend(server.socket, reconnect_timeout=0.3)

    async def main() -> None:
        await backend.acquire(Demand(2, FULL), BOUND)
        task = asyncio.create_task(backend.acquire(Demand(1, FULL), BOUND))
        await asyncio.to_thread(server.wait_for, f"pid {os.getpid()}: 1 whole GPU")
        server.kill()
        with pytest.raises(ConnectionError, match="reconnect_timeout"):
            await task

    asyncio.run(main())
    backend.close()


def test_labels_show_in_status_and_bad_labels_are_refused(server: Server) -> None:
    backend = UnixBackend(server.socket, name="train", command="python train.py --lr 3e-4")
    grant = backend.acquire_blocking(Demand(1, FULL), BOUND)
    (lease,) = status(server)["leases"]
    assert (lease["name"], lease["command"]) == ("train", "python train.py --lr 3e-4")
    code, out, _ = run_cli("status", "--socket", str(server.socket))
    assert code == 0 and "[train | python train.py --lr 3e-4]" in out
    backend.release(grant)
    backend.close()
    with pytest.raises(TypeError, match="name must be a string"):
        UnixBackend(server.socket, name=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="command must be at most 4096"):
        UnixBackend(server.socket, command="x" * 5000)
