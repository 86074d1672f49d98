"""A mixed workload on a 4-GPU logical pool: small fractional calls, half-GPU calls and a few
2-GPU calls, run concurrently as asyncio tasks; prints what ran where and how long each waited.

Run: ``python examples/mixed_workload.py`` (no GPU needed: the pool is logical).
"""

from __future__ import annotations

import asyncio
import random
import time

from hwpool import GPUPool, current_gpus


async def call(pool: GPUPool, name: str, demand: float | int, seconds: float) -> str:
    asked = time.perf_counter()
    lease = pool.lease_full(int(demand)) if demand >= 2 else pool.lease(float(demand))
    async with lease:
        waited = time.perf_counter() - asked
        gpus = current_gpus()
        await asyncio.sleep(seconds)  # stands in for the model call
    kind = f"{int(demand)} GPUs" if demand >= 2 else f"{demand:.2f} GPU"
    return (
        f"{name:<10} {kind:>9}  on GPU {','.join(map(str, gpus)):<5} waited {waited * 1000:6.1f} ms"
    )


async def main() -> None:
    pool = GPUPool(4)
    rng = random.Random(7)
    jobs: list[asyncio.Task[str]] = []
    for i in range(40):
        if i % 13 == 5:
            demand: float | int = 2
        elif i % 4 == 0:
            demand = 0.5
        else:
            demand = rng.choice([0.1, 0.25, 0.3])
        jobs.append(
            asyncio.create_task(call(pool, f"call-{i:02d}", demand, rng.uniform(0.05, 0.2)))
        )
        await asyncio.sleep(rng.uniform(0.0, 0.02))
    for line in await asyncio.gather(*jobs):
        print(line)
    snap = pool.snapshot()
    print(f"granted {snap.granted}, released {snap.released}, free {snap.free}")


if __name__ == "__main__":
    asyncio.run(main())
