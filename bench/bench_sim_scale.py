"""The simulator at scale: microseconds per task for each policy at 10k, 50k, 100k, 200k tasks.

The trace is synthetic and seeded: a steady stream of 0.1 to 0.5 GPU tasks with some whole-GPU
and 2-GPU jobs, on 8 GPUs, offered at 1.1 times the capacity so that the queue keeps growing
(the case where a policy that rescans its queue on every event turns quadratic). A linear
policy costs about the same per task at every size: the last column, the cost per task at the
largest size over the cost at the smallest, stays near 1. Each figure is the best of
``--rounds`` runs (default 3; the machine may be shared). The whole replay is timed, figures
(waits, lower bound) included, as ``hwpool simulate`` runs it; generating the trace is not.

Run: ``python bench/bench_sim_scale.py`` (about two minutes on 2 vCPUs), or ``--quick`` for
sizes of 1k to 4k, once each, or ``--sizes 10000,20000``.
"""

from __future__ import annotations

import argparse
import platform
import random
import time

from hwpool._core._capacity import UNITS_PER_GPU, fraction_to_units
from hwpool._sim._simulate import POLICIES, simulate
from hwpool._sim._trace import Task

SIZES = (10_000, 50_000, 100_000, 200_000)
QUICK_SIZES = (1_000, 2_000, 4_000)
GPUS = 8
OVERLOAD = 1.1  # offered work over capacity
MIX = ((0.1, 1), (0.25, 1), (0.25, 1), (0.5, 1), (1.0, 1), (1.0, 2))  # (fraction, count)


def workload(n: int, seed: int = 11) -> list[Task]:
    """``n`` seeded tasks, in arrival order, offered at :data:`OVERLOAD` times ``GPUS``."""
    rng = random.Random(seed)
    mean_work = sum(f * c for f, c in MIX) / len(MIX) * 2.0  # durations average 2 s
    rate = OVERLOAD * GPUS / mean_work
    tasks, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        fraction, count = rng.choice(MIX)
        units = UNITS_PER_GPU if count > 1 else fraction_to_units(fraction)
        tasks.append(Task(f"t{i}", t, count, units, rng.uniform(0.5, 3.5)))
    return tasks


def time_policy(tasks: list[Task], policy: str, rounds: int) -> float:
    """Seconds to simulate ``tasks`` under ``policy``: the best of ``rounds`` runs."""
    best = float("inf")
    for _ in range(rounds):
        begin = time.perf_counter()
        simulate(tasks, GPUS, policy)
        best = min(best, time.perf_counter() - begin)
    return best


def table(sizes: tuple[int, ...], policies: tuple[str, ...], rounds: int) -> str:
    """Run every policy at every size and return the table of us per task."""
    per_task: dict[str, list[float]] = {policy: [] for policy in policies}
    for n in sizes:
        tasks = workload(n)
        for policy in policies:
            per_task[policy].append(time_policy(tasks, policy, rounds) / n * 1e6)
    ratio = f"{_short(sizes[-1])}/{_short(sizes[0])}"
    header = f"{'policy':<16}" + "".join(f"{f'{n:,}':>10}" for n in sizes) + f"{ratio:>11}"
    lines = [
        f"simulator, us per task, {GPUS} GPUs, load {OVERLOAD:g}x, best of {rounds} "
        f"(Python {platform.python_version()}, {platform.machine()})",
        header,
    ]
    for policy, costs in per_task.items():
        cells = "".join(f"{us:>10.1f}" for us in costs)
        lines.append(f"{policy:<16}{cells}{costs[-1] / costs[0]:>10.2f}x")
    return "\n".join(lines)


def _short(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its table and return the table text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--sizes", help="comma-separated task counts, e.g. 10000,20000")
    parser.add_argument("--policy", default="all", help="comma-separated policies (default all)")
    parser.add_argument("--rounds", type=int, help="runs per figure (default 3; 1 with --quick)")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if args.sizes:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    policies = POLICIES if args.policy == "all" else tuple(args.policy.split(","))
    result = table(sizes, policies, max(1, rounds))
    print(result)
    return result


if __name__ == "__main__":
    main()
