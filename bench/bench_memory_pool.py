"""GPUPool sized in memory against the fraction pool, on bench_gpu_pool's contended benchmark.

10,000 asyncio tasks contend for 8 GPUs, each holding its grant across one yield to the loop,
with the same mix of demands: as fractions on ``GPUPool(8)``, as the same shares in MiB on
``GPUPool(gpu_memory=["80GiB"] * 8)``, and (for information) on a mixed pool of four 80 GiB
and four 24 GiB GPUs, as MiB and as fractions (a share of whichever GPU each lands on). Aim:
the memory-sized pool costs at most 1.2x the fraction pool (time per grant). Best of
interleaved rounds, on fresh event loops, as bench_gpu_pool does.
Run: ``python bench/bench_memory_pool.py``, or ``--quick`` for 1,000 tasks in 3 rounds (a smoke
run: its ratios are noisier).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import math
import platform
import time
from collections.abc import Awaitable, Callable

from hwpool import GPUPool

TASKS, ROUNDS = 10_000, 7
QUICK_TASKS, QUICK_ROUNDS = 1_000, 3
GPUS = 8
MIX = (0.1, 0.25, 0.5, 1.0, 0.3, 0.25, 0.1, 0.5)
GIB = 1024
SAME = [80 * GIB] * GPUS
MIXED = [80 * GIB] * (GPUS // 2) + [24 * GIB] * (GPUS // 2)


async def fraction_rate(tasks: int, sizes: list[int] | None = None) -> float:
    pool = GPUPool(GPUS) if sizes is None else GPUPool(gpu_memory=sizes)

    async def task(fraction: float) -> None:
        gpu = await pool.acquire(fraction)
        await asyncio.sleep(0)
        pool.release(gpu, fraction)

    start = time.perf_counter()
    await asyncio.gather(*(task(MIX[i % len(MIX)]) for i in range(tasks)))
    return tasks / (time.perf_counter() - start)


def _memory_rate(tasks: int, sizes: list[int], scale: int) -> Callable[[], Awaitable[float]]:
    amounts = [math.ceil(f * scale) for f in MIX]

    async def rate() -> float:
        pool = GPUPool(gpu_memory=sizes)

        async def task(mib: int) -> None:
            gpu = await pool.acquire(memory=mib)
            await asyncio.sleep(0)
            pool.release(gpu, memory=mib)

        start = time.perf_counter()
        await asyncio.gather(*(task(amounts[i % len(amounts)]) for i in range(tasks)))
        assert pool.snapshot().free_mib == tuple(sizes)
        return tasks / (time.perf_counter() - start)

    return rate


def measure(tasks: int = TASKS, rounds: int = ROUNDS) -> dict[str, float]:
    cases: list[tuple[str, Callable[[], Awaitable[float]]]] = [
        ("fraction", functools.partial(fraction_rate, tasks)),
        ("memory", _memory_rate(tasks, SAME, 80 * GIB)),
        ("mixed", _memory_rate(tasks, MIXED, 24 * GIB)),
        ("mixed fractions", functools.partial(fraction_rate, tasks, MIXED)),
    ]
    figures: dict[str, list[float]] = {}
    for i in range(rounds):
        for name, fn in cases if i % 2 == 0 else cases[::-1]:
            gc.collect()
            figures.setdefault(name, []).append(asyncio.run(fn()))
    return {name: max(values) for name, values in figures.items()}


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark and return its table (also printed when run as a script)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 tasks, 3 rounds")
    quick = parser.parse_args(argv).quick
    tasks, rounds = (QUICK_TASKS, QUICK_ROUNDS) if quick else (TASKS, ROUNDS)
    f = measure(tasks, rounds)
    cost = f["fraction"] / f["memory"]
    lines = [
        f"GPUPool in memory vs in fractions  (Python {platform.python_version()}, "
        f"{platform.machine()}; {tasks} tasks, {GPUS} GPUs, best of {rounds} rounds)",
        f"{'pool':<44}{'grants/s':>12}{'cost':>8}  aim",
        f"{'GPUPool(8), fractions':<44}{f['fraction']:>12,.0f}{1.0:>8.2f}",
        f"{'GPUPool(gpu_memory=[80GiB] * 8), MiB':<44}{f['memory']:>12,.0f}{cost:>8.2f}  <= 1.2",
        f"{'GPUPool(gpu_memory=4 x 80GiB + 4 x 24GiB), MiB':<44}{f['mixed']:>12,.0f}"
        f"{f['fraction'] / f['mixed']:>8.2f}",
        f"{'  the same, fractions (a share of each GPU)':<44}{f['mixed fractions']:>12,.0f}"
        f"{f['fraction'] / f['mixed fractions']:>8.2f}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
