"""The ``hwpool demo`` workload and its real-time run through a real :class:`GPUPool`.

The workload is generated from a fixed seed, so every run asks for the same thing: a stream of
small fractional calls (0.1 to 0.25 GPU), some half-GPU calls and a few 2-GPU calls arriving
over time, on 4 logical GPUs. Times are laid out for ``DEMO_SECONDS`` and scaled to the
duration asked for. Each task holds its lease for its duration (``asyncio.sleep`` stands in for
the GPU work); waits are measured on the event loop's clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable

from ._capacity import UNITS_PER_GPU, fraction_to_units
from ._gpu_pool import GPULease, GPUPool
from ._sim import TaskRun
from ._trace import Task

__all__ = ["DEMO_GPUS", "DEMO_SECONDS", "demo_workload", "run_gpu_stage"]

DEMO_GPUS = 4
DEMO_SECONDS = 8.0
_SMALL = (0.1, 0.2, 0.25)
_WIDE_AT = (1.0, 3.0, 4.6)  # arrivals of the 2-GPU calls, in unscaled seconds


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
    tasks: list[Task], num_gpus: int, on_done: Callable[[], None] = lambda: None
) -> list[TaskRun]:
    """Run ``tasks`` in real time through a fresh GPUPool; return when and where each ran.

    ``on_done`` is called (on the event loop) as each task finishes, for a progress bar.
    """
    return asyncio.run(_run_all(tasks, num_gpus, on_done))


async def _run_all(tasks: list[Task], num_gpus: int, on_done: Callable[[], None]) -> list[TaskRun]:
    pool = GPUPool(num_gpus)
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
