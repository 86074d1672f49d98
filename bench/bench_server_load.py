"""Load test of ``hwpool serve``: 50 client processes, 10,000 leases, 20% of them SIGKILLed.

Each client process (forked, so it opens its own connection) takes leases of a random mix of
demands (a tenth, a quarter, a half, one or two whole GPUs of 8), holds each for up to 2 ms
and gives it back, recording how long each grant took to arrive. Ten clients, chosen at
random, are SIGKILLed when they reach a random point of their work, holding or waiting; a new
client takes over what each had left. The run is done twice, so that what the server keeps
after clients come and go can be compared.

Each client takes its leases one at a time (``with pool.lease()``), then, in a second pair of
runs on the same server, pipelined: ``INFLIGHT`` asyncio tasks of one loop share its one
connection (``async with pool.lease()``), so that up to ``INFLIGHT`` of its requests are in
flight at once (``--inflight`` chooses; 1 runs only the first pair).

At the end: the free capacity equals the total, no lease or waiter is left, and the
server's resident memory did not grow in the second run of a pair. It prints grants per
second, the p50 and p99 of the time from request to grant, and the server's RSS before and
after. Run: ``python bench/bench_server_load.py [--quick] [--inflight K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import signal
import statistics
import time
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import hwpool
from _hostserver import host_server, rss_kib
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._wire._connection import Wire
from hwpool._wire._protocol import StatusReply

GPUS = 8
FULL = UNITS_PER_GPU
MIX: list[float | int] = [0.1, 0.25, 0.5, 1.0] * 5 + [2]  # one in 21 wants two whole GPUs
INFLIGHT = 4  # requests in flight per client process in the pipelined runs


class _Slot:
    """One client's share of the work and what it reports back through shared memory.

    (A plain class: ``hwpool bench`` loads this file without registering it as a module,
    which dataclasses need.)
    """

    def __init__(self, quota: int, latencies: Any, done: Synchronized[int]) -> None:
        self.quota = quota
        self.latencies = latencies  # RawArray of seconds, one per completed lease
        self.done = done
        self.proc: Any = None
        self.kill_at: int | None = None


def _client(
    path: str, slot_latencies: Any, done: Synchronized[int], quota: int, seed: int, *,
    inflight: int = 1,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    pool = hwpool.connect(path)  # forked: this process opens its own connection
    if inflight > 1:
        asyncio.run(_pipelined(pool, rng, slot_latencies, done, quota=quota, inflight=inflight))
        pool.close()
        return
    for i in range(quota):
        demand = rng.choice(MIX)
        lease = pool.lease_full(2) if demand == 2 else pool.lease(demand)
        start = time.perf_counter()
        with lease:
            slot_latencies[i] = time.perf_counter() - start
            time.sleep(rng.random() * 0.002)  # the work done under the lease
        done.value = i + 1
    pool.close()


async def _pipelined(
    pool: hwpool.GPUPool, rng: random.Random, slot_latencies: Any, done: Synchronized[int], *,
    quota: int, inflight: int,
) -> None:  # fmt: skip
    """``inflight`` tasks share the client's ``quota`` leases and its one connection; a lease's
    wait is recorded when it ends, so the first ``done`` latencies are those of done leases."""
    leases = iter(range(quota))  # shared: each task takes the next lease to do

    async def worker() -> None:
        for _ in leases:
            demand = rng.choice(MIX)
            lease = pool.lease_full(2) if demand == 2 else pool.lease(demand)
            start = time.perf_counter()
            async with lease:
                waited = time.perf_counter() - start
                await asyncio.sleep(rng.random() * 0.002)  # the work done under the lease
            slot_latencies[done.value] = waited
            done.value += 1

    await asyncio.gather(*(worker() for _ in range(inflight)))


def _start(ctx: Any, path: Path, quota: int, seed: int, inflight: int) -> _Slot:
    slot = _Slot(quota, ctx.RawArray("d", quota), ctx.Value("i", 0, lock=False))
    slot.proc = ctx.Process(target=_client, args=(str(path), slot.latencies, slot.done, quota,
                                                  seed), kwargs={"inflight": inflight})  # fmt: skip
    slot.proc.start()
    return slot


def _status(path: Path) -> StatusReply:
    wire = Wire(path)
    try:
        return wire.status()  # all of it, however long the queue
    finally:
        wire.shutdown()


def _settled(path: Path, timeout: float = 20.0) -> StatusReply:
    """The server's status once every lease and waiter is gone (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        reply = _status(path)
        if (not reply.leases and not reply.waiting) or time.monotonic() > deadline:
            return reply
        time.sleep(0.05)


def _kill(slot: _Slot) -> bool:
    """SIGKILL the slot's client and reap it; False if it had already exited by itself.

    The client may finish its work between the check of its progress and the kill, and
    multiprocessing reaps finished children whenever another one starts, so its pid can be
    gone: ``Process.kill`` (not ``os.kill`` of the pid) does nothing then, where ``os.kill``
    raised ProcessLookupError.
    """
    slot.proc.kill()
    slot.proc.join()
    return bool(slot.proc.exitcode == -signal.SIGKILL)


def run_once(
    path: Path, clients: int, leases: int, killed: int, seed: int, *, inflight: int = 1
) -> dict[str, Any]:
    """One run: ``clients`` processes share ``leases`` leases; ``killed`` of them die; each
    has up to ``inflight`` requests in flight."""
    ctx = mp.get_context("fork")
    rng = random.Random(seed)
    quota = leases // clients
    slots = [_start(ctx, path, quota, rng.randrange(1 << 30), inflight) for _ in range(clients)]
    for slot in rng.sample(slots, killed):
        slot.kill_at = rng.randrange(1, quota)
    start = time.perf_counter()
    finished: list[_Slot] = []
    kills = 0
    while slots:
        for slot in list(slots):
            if slot.kill_at is not None and slot.done.value >= slot.kill_at:
                kills += _kill(slot)
                slots.remove(slot)
                finished.append(slot)
                left = slot.quota - slot.done.value
                if left:
                    slots.append(_start(ctx, path, left, rng.randrange(1 << 30), inflight))
            elif not slot.proc.is_alive():
                slot.proc.join()
                slots.remove(slot)
                finished.append(slot)
        time.sleep(0.002)
    elapsed = time.perf_counter() - start
    latencies = [s.latencies[i] for s in finished for i in range(s.done.value)]
    return {"elapsed": elapsed, "latencies": latencies, "kills": kills,
            "processes": len(finished), "status": _settled(path)}  # fmt: skip


def _check(status: StatusReply) -> list[str]:
    problems = []
    if status.free != (FULL,) * GPUS:
        problems.append(f"free capacity {status.free} is not the total")
    if status.leases or status.waiting:
        problems.append(f"{len(status.leases)} leases and {len(status.waiting)} waiters left")
    return problems


def _row(name: str, inflight: int, result: dict[str, Any]) -> str:
    lat = sorted(result["latencies"])
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return (
        f"{name:<7}{inflight:>10}{result['processes']:>10}{result['kills']:>8}"
        f"{len(lat) / result['elapsed']:>10,.0f}{statistics.median(lat) * 1e3:>9.2f}"
        f"{p99 * 1e3:>9.2f}"
    )


def main(argv: list[str] | None = None) -> str:
    """Run the load test twice on one server, one request at a time per client, then twice
    pipelined, and return its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 clients, 300 leases (a smoke run)")
    parser.add_argument("--inflight", type=int, default=INFLIGHT,
                        help=f"requests in flight per client in the pipelined runs (default "
                             f"{INFLIGHT}; 1: no pipelined runs)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.inflight < 1:
        parser.error(f"--inflight must be at least 1, got {args.inflight}")
    clients, leases, killed = (6, 300, 2) if args.quick else (50, 10_000, 10)
    depths = sorted({1, args.inflight})
    lines = [
        f"hwpool serve under load: {GPUS} GPUs, {clients} client processes, {leases} leases "
        f"per run, {killed} clients SIGKILLed per run",
        f"{'run':<7}{'in flight':>10}{'processes':>10}{'killed':>8}{'grants/s':>10}"
        f"{'p50 ms':>9}{'p99 ms':>9}",
    ]
    problems: list[str] = []
    rss: list[str] = []
    with host_server(GPUS, "--max-connections", "256") as (path, server):
        for inflight in depths:
            rss_start = rss_kib(server.pid)
            first = run_once(path, clients, leases, killed, 1, inflight=inflight)
            rss_first = rss_kib(server.pid)
            second = run_once(path, clients, leases, killed, 2, inflight=inflight)
            rss_second = rss_kib(server.pid)
            lines += [_row("first", inflight, first), _row("second", inflight, second)]
            problems += _check(first["status"]) + _check(second["status"])
            growth = rss_second - rss_first
            if growth > max(2048, rss_first // 10):
                problems.append(f"the server grew by {growth} KiB in the second run")
            rss.append(
                f"server RSS ({inflight} in flight): {rss_start} KiB at start, {rss_first} KiB "
                f"after the first run, {rss_second} KiB after the second ({growth:+d} KiB)"
            )
    lines += rss
    verdict = "; ".join(problems) or "free == total, no lease or waiter left, no growth: OK"
    lines.append(f"checks: {verdict}")
    table = "\n".join(lines)
    print(table)
    if problems:
        raise AssertionError("; ".join(problems))
    return table


if __name__ == "__main__":
    main()
