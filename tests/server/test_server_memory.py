"""A host server sized in memory: requests in MiB, GPUs of different sizes, MIG, restarts.

The bookkeeping is tested sans-I/O on HostState; the rest on real ``hwpool serve`` processes.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import hwpool
from fakes.gpus import A100, RTX, smi_script
from hostserver import BOUND, SRC, ClientProc, Server, run_cli, status_of
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._server._host_entries import Client
from hwpool._server._host_state import HostState
from hwpool._server._journal import Journal, JournalEntry
from hwpool._wire import _protocol as p
from hwpool._wire._protocol import ErrorCode, ProtocolError

StartServer = Callable[..., Server]
Clients = Callable[..., ClientProc]
GIB = 1024
MIXED = (80 * GIB, 24 * GIB)


def client(pid: int = 10, number: int = 1) -> Client:
    return Client(number, 1000, pid)


def mib(req: int, amount: int, *, wait: bool = True) -> p.Acquire:
    return p.Acquire(req, 1, amount, wait, unit="mib")


def whole(req: int, count: int = 1) -> p.Acquire:
    return p.Acquire(req, count, UNITS_PER_GPU, True)


def test_memory_requests_are_granted_by_best_fit_in_mib() -> None:
    state, a = HostState(2, totals=MIXED), client()
    assert state.units_per_gpu == UNITS_PER_GPU and state.totals == MIXED
    assert state.acquire(a, mib(1, 6 * GIB), 0.0) == [(a, p.Granted(1, 1, (1,), 6 * GIB))]
    assert state.acquire(a, mib(2, 40 * GIB), 0.0) == [(a, p.Granted(2, 2, (0,), 40 * GIB))]
    assert state.core.free == (40 * GIB, 18 * GIB)
    state.release(a, p.Release(3, 1), 1.0)
    state.release(a, p.Release(4, 2, gpu=0, units=40 * GIB), 1.0)
    assert state.core.free == MIXED and a.entries == {}


def test_whole_gpus_of_different_sizes_are_held_at_each_total() -> None:
    state, a, b = HostState(2, totals=MIXED), client(pid=1), client(pid=2, number=2)
    assert state.acquire(a, mib(1, GIB), 0.0)[0][1] == p.Granted(1, 1, (1,), GIB)
    assert state.acquire(b, whole(1, 2), 0.0) == [(b, p.Queued(1, 2))]
    (record,) = state.status(9, 0.0, 0.0).waiting
    assert (record.count, record.units, record.unit) == (2, UNITS_PER_GPU, "gpu")
    out = state.release(a, p.Release(2, 1), 1.0)
    assert out == [(b, p.Granted(1, 2, (0, 1), 0))]  # 0: each GPU whole, at its own size
    (lease,) = state.status(9, 1.0, 0.0).leases
    assert lease.held == ((0, 80 * GIB), (1, 24 * GIB)) and state.core.free == (0, 0)
    assert state.disconnect(b, 2.0) == [] and state.core.free == MIXED


def test_a_share_of_a_gpu_is_that_share_of_the_gpu_it_lands_on() -> None:
    state, a = HostState(2, totals=MIXED), client()
    half = p.Acquire(1, 1, UNITS_PER_GPU // 2, True)  # what a client that knows no MiB sends
    assert state.acquire(a, half, 0.0) == [(a, p.Granted(1, 1, (1,), 12 * GIB))]
    assert state.acquire(a, p.Acquire(2, 1, UNITS_PER_GPU // 2, True), 0.0)[0][1].gpus == (1,)
    assert state.acquire(a, p.Acquire(3, 1, UNITS_PER_GPU // 4, True), 0.0) == [
        (a, p.Granted(3, 3, (0,), 20 * GIB))
    ]
    assert isinstance(only(state.acquire(a, p.Acquire(4, 1, UNITS_PER_GPU - 1, True), 0.0)),
                      p.Queued)  # fmt: skip
    (record,) = state.status(9, 0.0, 0.0).waiting
    assert (record.units, record.unit) == (UNITS_PER_GPU - 1, "gpu")
    state.release(a, p.Release(5, 3), 1.0)
    assert state.core.free == (0, 0)  # the waiter took 80 GiB less a unit's worth
    assert {e.id: e.held for e in a.entries.values()}[4] == {0: 80 * GIB}


def only(deliveries: list[tuple[Client, p.ServerMessage]]) -> p.ServerMessage:
    assert len(deliveries) == 1, deliveries
    return deliveries[0][1]


def test_a_waiter_for_memory_shows_in_mib_and_is_journaled() -> None:
    state, a, b = HostState(1, totals=(24 * GIB,)), client(pid=1), client(pid=2, number=2)
    state.acquire(a, mib(1, 20 * GIB), 0.0)
    assert state.acquire(b, mib(1, 8 * GIB), 0.0) == [(b, p.Queued(1, 2))]
    (record,) = state.status(9, 0.0, 0.0).waiting
    assert (record.units, record.unit) == (8 * GIB, "mib")
    assert [(e.count, e.units, e.held) for e in state.journal().entries] == [
        (1, 20 * GIB, ((0, 20 * GIB),)),
        (1, 8 * GIB, None),
    ]


@pytest.mark.parametrize(
    ("totals", "message", "match"),
    [
        (None, mib(1, 6 * GIB), "this server shares fractions of a GPU, not memory"),
        (MIXED, p.Acquire(1, 2, 6 * GIB, True, unit="mib"), "a memory request is for one GPU"),
        (MIXED, mib(1, 80 * GIB + 1), "the largest GPU of this host has 81920 MiB"),
        (MIXED, p.Acquire(1, 2, UNITS_PER_GPU // 2, True), "several GPUs are granted whole"),
        (MIXED, p.Acquire(1, 1, UNITS_PER_GPU + 1, True), "a GPU has 63000000 units"),
        (MIXED, whole(1, 3), "count=3 but this host has 2 GPUs"),
    ],
)
def test_bad_memory_requests_change_nothing(
    totals: tuple[int, ...] | None, message: p.Acquire, match: str
) -> None:
    state, a = HostState(2, totals=totals), client()
    with pytest.raises(ProtocolError, match=match) as info:
        state.acquire(a, message, 0.0)
    assert info.value.code is ErrorCode.BAD_REQUEST and info.value.req == 1
    assert state.core.free == state.core.totals and a.entries == {} and state.changes == 0


def test_mig_instances_are_never_granted_together() -> None:
    state, a = HostState(2, totals=(10 * GIB, 20 * GIB), mig=True), client()
    with pytest.raises(ProtocolError, match="MIG instances"):
        state.acquire(a, whole(1, 2), 0.0)
    assert state.acquire(a, whole(2), 0.0) == [(a, p.Granted(2, 1, (0,), 10 * GIB))]


def test_two_compute_instances_of_one_gpu_instance_share_its_memory() -> None:
    """Issue 36 (the H200 MIG capture, tests/fakes/captures/): MIG devices 0 and 1 are
    compute instances of GPU instance 2 and both report its 71424 MiB; the server never
    grants more on them together."""
    groups = ["gi2", "gi2", None]
    state = HostState(3, totals=(71424, 71424, 33280), mig=True, memory_groups=groups)
    a, b = client(pid=1), client(pid=2, number=2)
    assert state.acquire(a, mib(1, 40 * GIB), 0.0) == [(a, p.Granted(1, 1, (0,), 40 * GIB))]
    assert state.core.free == (30464, 30464, 33280)
    assert state.acquire(b, mib(1, 40 * GIB), 0.0) == [(b, p.Queued(1, 2))]
    state.release(a, p.Release(2, 1), 1.0)  # b's request is granted on GPU instance 2
    assert state.core.free == (30464, 30464, 33280)


def test_totals_must_match_the_gpu_count() -> None:
    with pytest.raises(ValueError, match="totals must give 2 GPUs"):
        HostState(2, totals=(GIB,))


def test_a_memory_lease_and_a_whole_one_are_reclaimed_after_a_restart() -> None:
    state, a = HostState(2, totals=MIXED), client()
    journal = Journal(10, (JournalEntry(7, 1000, 10, 1, 6 * GIB, ((1, 6 * GIB),)),
                           JournalEntry(8, 1000, 10, 1, 80 * GIB, ((0, 80 * GIB),)),
                           JournalEntry(9, 1000, 11, 1, GIB, ((0, GIB),))))  # fmt: skip
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    held = p.Reclaim(1, 7, 1, 6 * GIB, ((1, 6 * GIB),), 3.0, unit="mib")
    assert state.reclaim(a, held, 5.0) == [(a, p.Granted(1, 7, (1,), 6 * GIB))]
    big = p.Reclaim(2, 8, 1, UNITS_PER_GPU, ((0, 80 * GIB),), 3.0)
    assert state.reclaim(a, big, 5.0)[0][1] == p.Granted(2, 8, (0,), 80 * GIB)
    assert state.core.free == (0, 18 * GIB)
    with pytest.raises(ProtocolError, match="cannot reclaim") as info:
        state.reclaim(client(pid=11, number=2), p.Reclaim(1, 9, 1, GIB, ((0, GIB),), 1.0), 5.0)
    assert info.value.code is ErrorCode.LOST and state.core.free == (0, 18 * GIB)


# ----------------------------------------------------------------- real servers
def test_a_pool_on_a_memory_server_asks_in_mib(start_server: StartServer) -> None:
    server = start_server("--gpu-memory", "80GiB,24GiB")
    with hwpool.connect(server.socket) as pool:
        assert pool.gpu_memory == MIXED and [g.memory_mib for g in pool.gpus] == list(MIXED)
        with pool.lease(memory="6GiB") as gpus:
            assert gpus == [1]
            server.wait_for("grant #1 to root (uid 0) pid")
            report = status_of(server.socket)
            assert report["sized_in_memory"] is True
            assert [g["free_mib"] for g in report["gpus"]] == [80 * GIB, 18 * GIB]
            assert [g["total_mib"] for g in report["gpus"]] == list(MIXED)
            assert report["leases"][0]["held_mib"] == [[1, 6 * GIB]]
            code, text, _ = run_cli("status", "--socket", str(server.socket))
            assert code == 0 and "6GiB of GPU 1" in text and "18GiB of 24GiB" in text
        assert "6144 MiB of GPU 1" in server.wait_for("grant #1")


def test_a_server_sized_by_detection(sockdir: Path, fake_smi: Callable[..., object]) -> None:
    fake_smi(smi_script([A100, RTX]))
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"}  # with the fake's PATH
    server = Server(sockdir / "s.sock", "--memory", env=env)
    try:
        with hwpool.connect(server.ready().socket) as pool:
            assert pool.gpu_memory == (A100.memory_mib, RTX.memory_mib)
            assert [g.name for g in pool.gpus] == [A100.name, RTX.name]
    finally:
        server.kill()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--gpus", "2", "--gpu-memory", "8GiB"), "give --gpus or --gpu-memory, not both"),
        (("--memory", "--gpu-memory", "8GiB"), "give --memory (detect the sizes) or"),
        (("--gpu-memory", "8 gigs"), "argument --gpu-memory: GPU 0's memory must be"),
        (("--gpu-memory", "8GiB,8GB"), "GPU 1's memory must be an int of MiB"),
    ],
)
def test_bad_serve_sizes_are_usage_errors(args: tuple[str, ...], match: str) -> None:
    code, _, err = run_cli("serve", "--socket", "/tmp/hwpool-never/s.sock", *args)
    assert code == 2 and match in err


def test_memory_without_detected_sizes_is_a_usage_error(
    fake_smi: Callable[..., object],
) -> None:
    fake_smi("exit 9\n")  # nvidia-smi fails: nothing is known of any GPU's memory
    code, _, err = run_cli("serve", "--socket", "/tmp/hwpool-never/s.sock", "--memory")
    assert code == 2 and "--memory: memory=True needs every GPU's memory" in err


def test_a_memory_server_restart_keeps_leases_and_waiters(
    start_server: StartServer, clients: Clients
) -> None:
    args = ("--gpu-memory", "80GiB,24GiB", "--grace", "8")
    server = start_server(*args)
    holder, waiter = clients(server.socket), clients(server.socket)
    holder.send(f"mem h {6 * GIB}")
    assert holder.expect("granted h") == "granted h [1]"
    pool = hwpool.connect(server.socket)
    assert pool.acquire_full_blocking(1, timeout=BOUND) == [0]  # whole: GPU 1 is in use
    waiter.send(f"mem w {20 * GIB}")
    server.wait_for(f"wait #3 of root (uid 0) pid {waiter.pid}: 20480 MiB")
    before = status_of(server.socket)

    server.proc.kill()
    server.proc.wait(BOUND)
    again = start_server(*args)
    again.wait_for("recovery over")
    after = status_of(server.socket)
    assert after["leases"] == [
        {**lease, "held_s": after_lease["held_s"]}
        for lease, after_lease in zip(before["leases"], after["leases"], strict=True)
    ]
    assert [(w["id"], w["memory_mib"]) for w in after["waiting"]] == [(3, 20 * GIB)]
    pool.release(0)
    assert waiter.expect("granted w") == "granted w [0]"
    pool.close()
    os.kill(holder.pid, signal.SIGKILL)
    holder.proc.wait(BOUND)
    waiter.send("release w")
    waiter.expect("released w")
    assert [g["free_mib"] for g in status_of(server.socket)["gpus"]] == list(MIXED)


def test_status_json_on_a_fraction_server_has_no_mib(start_server: StartServer) -> None:
    server = start_server("--gpus", "1")
    code, out, _ = run_cli("status", "--socket", str(server.socket), "--json")
    report = json.loads(out)
    assert code == 0 and report["sized_in_memory"] is False
    assert report["gpus"][0]["free_mib"] is None and report["gpus"][0]["free"] == 1.0


def test_a_server_leaves_alone_the_memory_in_use_at_its_start(
    sockdir: Path, fake_smi: Callable[..., object]
) -> None:
    fake_smi(smi_script([replace(A100, used_mib=2048), replace(RTX, used_mib=500)]))
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"}
    server = Server(sockdir / "s.sock", "--memory", "--reserve-in-use", env=env)
    try:
        with hwpool.connect(server.ready().socket) as pool:
            assert pool.gpu_memory == (A100.memory_mib - 2048, RTX.memory_mib - 500)
            with pytest.raises(ValueError, match="more than the largest GPU of this pool"):
                pool.acquire_nowait(memory=A100.memory_mib - 2047)
        report = status_of(server.socket)  # reads the use again, here from the fake
        assert [g["in_use_mib"] for g in report["gpus"]] == [2048, 500]
        assert [g["total_mib"] for g in report["gpus"]] == list(pool.gpu_memory)
        _, text, _ = run_cli("status", "--socket", str(server.socket))
        assert "(2GiB in use now, all processes)" in text
    finally:
        server.kill()


@pytest.mark.parametrize(
    ("args", "used", "match"),
    [
        (("--reserve-in-use",), 100, "--reserve-in-use reads the memory in use on detected"),
        (("--gpus", "2", "--reserve-in-use"), 100, "--reserve-in-use reads the memory in use"),
        (("--memory", "--reserve-in-use"), None, "reserve_in_use=True needs every GPU's memory"),
        (("--memory", "--reserve-in-use"), 81920, "nothing is left to share"),
    ],
)
def test_bad_reserve_in_use_is_a_usage_error(
    fake_smi: Callable[..., object], args: tuple[str, ...], used: int | None, match: str
) -> None:
    fake_smi(smi_script([replace(A100, used_mib=used)]))
    code, _, err = run_cli("serve", "--socket", "/tmp/hwpool-never/s.sock", *args)
    assert code == 2 and match in err
