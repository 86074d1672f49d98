"""The ``hwpool demo`` workloads: GPU calls through a real :class:`GPUPool`, then a CPUPool job.

The workload is generated from a fixed seed, so every run asks for the same thing: a stream of
small fractional calls (0.1 to 0.25 GPU), some half-GPU calls and a few 2-GPU calls arriving
over time, on 4 logical GPUs. Times are laid out for ``DEMO_SECONDS`` and scaled to the
duration asked for. Each task holds its lease for its duration (``asyncio.sleep`` stands in for
the GPU work); waits are measured on the event loop's clock.

The CPU stage hashes a buffer in chunks (hashlib releases the GIL on large inputs, so threads
run truly in parallel without any third-party package), once serially on the calling thread
and once on ``CPUPool.from_env()``, checks that both give the same digests, and times both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from .._core._capacity import UNITS_PER_GPU, fraction_to_units
from .._cpu._pool import CPUPool
from .._gpu._lease import GPULease
from .._gpu._pool import GPUPool
from .._sim._simulate import TaskRun
from .._sim._trace import Task
from ._args import DEMO_SECONDS

__all__ = [
    "DEMO_GPUS",
    "DEMO_SECONDS",
    "CPUStage",
    "demo_workload",
    "run_cpu_stage",
    "run_gpu_stage",
]

DEMO_GPUS = 4
_SMALL = (0.1, 0.2, 0.25)
_WIDE_AT = (1.0, 3.0, 4.6)  # arrivals of the 2-GPU calls, in unscaled seconds
_CHUNK = bytes(range(256)) * 4096  # 1 MiB: one row of the CPU stage
_ROUNDS = 4  # hashes per row


def demo_workload(seconds: float = DEMO_SECONDS, seed: int = 7) -> list[Task]:
    """The demo's tasks, sorted by arrival, laid out to finish in about ``seconds``."""
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    rng = random.Random(seed)
    scale = seconds / DEMO_SECONDS
    tasks: list[Task] = []

    def add(name: str, arrival: float, fraction: float, count: int, duration: float) -> None:
        units = fraction_to_units(fraction)
        tasks.append(Task(name, arrival * scale, count, units, duration * scale))

    t = 0.0
    while (t := t + rng.expovariate(16.0)) < 6.0:
        add(f"small{len(tasks)}", t, rng.choice(_SMALL), 1, rng.uniform(0.2, 0.7))
    t = 0.0
    while (t := t + rng.expovariate(2.0)) < 6.0:
        add(f"half{len(tasks)}", t, 0.5, 1, rng.uniform(0.5, 1.3))
    for i, arrival in enumerate(_WIDE_AT):
        add(f"wide{i}", arrival, 1.0, 2, 1.2)
    return sorted(tasks, key=lambda task: task.arrival)


def run_gpu_stage(
    tasks: list[Task],
    num_gpus: int,
    on_done: Callable[[], None] = lambda: None,
    *,
    policy: str | None = None,
) -> list[TaskRun]:
    """Run ``tasks`` in real time through a fresh GPUPool; return when and where each ran.

    ``on_done`` is called (on the event loop) as each task finishes, for a progress bar.
    ``policy``: the pool's scheduling policy (None: the default).
    """
    return asyncio.run(_run_all(tasks, num_gpus, on_done, policy))


async def _run_all(
    tasks: list[Task], num_gpus: int, on_done: Callable[[], None], policy: str | None
) -> list[TaskRun]:
    pool = GPUPool(num_gpus, policy=policy)
    loop = asyncio.get_running_loop()
    origin = loop.time()

    async def one(task: Task) -> TaskRun:
        await asyncio.sleep(max(0.0, origin + task.arrival - loop.time()))
        arrived = loop.time() - origin
        async with _lease(pool, task) as gpus:
            start = loop.time() - origin
            await asyncio.sleep(task.duration)  # stands in for the GPU work
            end = loop.time() - origin
        on_done()
        return TaskRun(dataclasses.replace(task, arrival=arrived), start, end, tuple(gpus))

    return list(await asyncio.gather(*(one(task) for task in tasks)))


def _lease(pool: GPUPool, task: Task) -> GPULease:
    if task.count > 1:
        return pool.lease_full(task.count)
    return pool.lease(task.units / UNITS_PER_GPU)


@dataclass(frozen=True, slots=True)
class CPUStage:
    """The CPU stage's figures: ``rows`` hashed by a team of ``team`` threads, and timings."""

    rows: int
    team: int
    serial_s: float
    pool_s: float

    @property
    def speedup(self) -> float:
        """Serial time over pool time."""
        return self.serial_s / self.pool_s if self.pool_s > 0 else 1.0


def _hash_rows(out: list[bytes], start: int, end: int) -> None:
    for row in range(start, end):
        digest = hashlib.blake2b(row.to_bytes(8, "little"))
        for _ in range(_ROUNDS):
            digest.update(_CHUNK)
        out[row] = digest.digest()


def run_cpu_stage(rows: int) -> CPUStage:
    """Hash ``rows`` chunks serially, then on ``CPUPool.from_env()``; the digests must agree.

    Raises ValueError for a malformed ``HWPOOL_THREADS``; RuntimeError if the pool's digests
    differ from the serial ones (a bug, never expected).
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    serial: list[bytes] = [b""] * rows
    begin = time.perf_counter()
    _hash_rows(serial, 0, rows)
    serial_s = time.perf_counter() - begin
    pool = CPUPool.from_env()
    if pool is None:  # one usable CPU: the pool would be the caller alone
        return CPUStage(rows, 1, serial_s, serial_s)
    with pool:
        parallel: list[bytes] = [b""] * rows
        begin = time.perf_counter()
        pool.run_rows(rows, lambda start, end: _hash_rows(parallel, start, end), grain=1)
        pool_s = time.perf_counter() - begin
        team = pool.n_participants
    if parallel != serial:
        raise RuntimeError("CPU stage: the pool's digests differ from the serial ones")
    return CPUStage(rows, team, serial_s, pool_s)
