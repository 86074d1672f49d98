"""The core's waiting queue at scale: microseconds per task to fill and drain n waiters.

One scheduler over 4 GPUs; a 4-GPU grant holds them all while ``n`` seeded single-GPU demands
(0.1 to 1.0 GPU) queue behind it, then every grant is released in turn until the queue is
empty. Each release walks the queue from its front, from which the granted waiters left: with
the ``dict`` queue of 0.1.x every walk skipped every deleted slot (quadratic), with the
``OrderedDict`` it visits live waiters only. A linear queue costs about the same per task at
every size, so the ratio column (cost per task over the cost at the first size) stays near 1.
Each figure is the best of ``--rounds`` runs (default 3; the machine may be shared).

Run: ``python bench/bench_queue.py`` (about a minute on 2 vCPUs), ``--quick`` for 2k to 8k
once each, ``--sizes 10000,20000``, or ``--dict`` to time the 0.1.x plain-dict queue for comparison.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from collections import deque

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand, Grant, Scheduler

SIZES = (10_000, 50_000, 100_000, 200_000)
QUICK_SIZES = (2_000, 4_000, 8_000)
GPUS = 4
FRACTIONS = (0.1, 0.25, 0.5, 1.0)


def demands(n: int, seed: int = 8) -> list[Demand]:
    """``n`` seeded single-GPU demands."""
    rng = random.Random(seed)
    return [Demand(1, round(rng.choice(FRACTIONS) * UNITS_PER_GPU)) for _ in range(n)]


def drain(queue: list[Demand], plain_dict: bool) -> float:
    """Seconds to queue ``queue`` behind a full pool and release grants until it is empty."""
    core = Scheduler(GPUS)
    if plain_dict:
        core._queue = {}  # type: ignore[assignment]
    begin = time.perf_counter()
    _, first = core.submit(Demand(GPUS, UNITS_PER_GPU))
    assert first is not None
    for demand in queue:
        core.submit(demand)
    held: deque[Grant] = deque([first])
    while held:
        grant = held.popleft()
        for gpu in grant.gpus:
            held.extend(core.release(gpu, grant.units))
    elapsed = time.perf_counter() - begin
    assert core.queue_length == 0
    return elapsed


def table(sizes: tuple[int, ...], rounds: int, plain_dict: bool) -> str:
    """Time every size and return the table: us per task, and each size over the first."""
    costs = []
    for n in sizes:
        queue = demands(n)
        costs.append(min(drain(queue, plain_dict) for _ in range(rounds)) / n * 1e6)
    kind = "dict (0.1.x)" if plain_dict else "OrderedDict"
    lines = [
        f"core queue ({kind}), fill and drain, {GPUS} GPUs, best of {rounds} "
        f"(Python {platform.python_version()}, {platform.machine()})",
        f"{'tasks':>10}{'us/task':>10}{'ratio':>9}",
    ]
    for n, us in zip(sizes, costs, strict=True):
        lines.append(f"{n:>10,}{us:>10.2f}{us / costs[0]:>8.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its table and return the table text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--sizes", help="comma-separated task counts, e.g. 10000,20000")
    parser.add_argument("--rounds", type=int, help="runs per figure (default 3; 1 with --quick)")
    parser.add_argument("--dict", action="store_true", help="time the 0.1.x plain-dict queue")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if args.sizes:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    result = table(sizes, max(1, rounds), args.dict)
    print(result)
    return result


if __name__ == "__main__":
    main()
