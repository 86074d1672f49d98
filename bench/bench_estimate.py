"""How honest the estimated starts are: each waiting task's estimate, taken when it is
submitted, against when it really starts, in the simulator (issue 37).

Every trace of ``bench_policy.py`` (the flaw traces P1-P3 where this is a source checkout,
the bundled ``batch`` and ``embedding``, the seeded generated ones: ``_policy_traces``) runs
on four GPUs, and the bundled ``serving`` trace on its 80 GiB and 24 GiB GPUs, under the
core's ``easy`` (the host server's backfill: by limits) and ``reserve-all``, each as the
trace is (no task has a limit) and with every task given a limit of ``--limit-factor`` times
its duration (default 2: a user's ``--time`` with room to spare, never reached). ``burst``
is always a tenth its size here (at full size each of its estimates replays 10,000
waiters). Per trace and run: how many tasks waited and had their start estimated, how many
of those estimates were unknown, and the mean and p90 of estimated minus actual start (> 0:
the estimate was late, the task started sooner) and of its size.

An explanation replays the queue, so on long queues only every k-th waiting task is
estimated (about ``--samples`` per run, default 40; the column ``every`` says which k;
``waits``: the waits estimated). Virtual time: the figures
are the same on every machine for one seed. Run: ``python bench/bench_estimate.py``
(``--quick``: generated traces a tenth the size; ``--trace P1,gang``; ``--seed N``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # `hwpool bench` and `python bench/...` put it there; an import may not
    sys.path.insert(0, _HERE)

from _policy_traces import GPUS, all_traces  # noqa: E402
from hwpool._core._memory import parse_memory  # noqa: E402
from hwpool._sim._estimates import (  # noqa: E402
    estimate_stats,
    measure_estimates,
    with_limits,
)
from hwpool._sim._simulate import simulate  # noqa: E402
from hwpool._sim._trace import Task, load_trace  # noqa: E402

SEED = 9
SAMPLES = 40
LIMIT_FACTOR = 2.0
SERVING_GPUS = ("80GiB", "24GiB")
POLICIES = ("easy", "reserve-all")
SIM_NAMES = {"easy": "hwpool-limits", "reserve-all": "hwpool-reserve-all"}
"""The simulator's names of the core's policies (with the server's backfill)."""


def traces(
    seed: int, quick: bool
) -> dict[str, tuple[Callable[[], list[Task]], tuple[int, ...] | None]]:
    """Each trace by name, with its GPUs' memory (None: four GPUs shared in fractions)."""
    found: dict[str, tuple[Callable[[], list[Task]], tuple[int, ...] | None]] = {
        name: (make, None) for name, make in all_traces(seed, quick).items()
    }
    # At full size each estimate of ``burst`` replays 10,000 waiters: minutes each.
    found["burst"] = (all_traces(seed, True)["burst"], None)
    memory = tuple(parse_memory(size) for size in SERVING_GPUS)
    found["serving"] = (lambda: load_trace("serving", max_gpus=len(memory)), memory)
    return found


def row(tasks: list[Task], memory: tuple[int, ...] | None, policy: str, samples: int) -> str:
    """One run's figures as a table row."""
    gpus = GPUS if memory is None else len(memory)
    schedule = simulate(tasks, gpus, SIM_NAMES[policy], gpu_memory=memory)
    waits = sum(1 for run in schedule.runs if run.start > run.task.arrival)
    every = max(1, math.ceil(waits / samples))
    began = time.perf_counter()
    found = measure_estimates(tasks, gpus, policy, gpu_memory=memory, every=every)
    took = time.perf_counter() - began
    stats = estimate_stats(found)
    known = stats.waited - stats.unknown
    figures = (
        f"{stats.mean_error:9.2f} {stats.p90_error:9.2f} {stats.mean_abs:9.2f} {stats.p90_abs:9.2f}"
        if known
        else f"{'-':>9} {'-':>9} {'-':>9} {'-':>9}"
    )
    return f"{stats.waited:7d} {stats.unknown:7d} {figures} {every:5d} {took:6.1f}"


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its text and return it."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="generated traces 1/10 the size")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed (default {SEED})")
    parser.add_argument("--trace", help="comma-separated traces (default all)")
    parser.add_argument(
        "--samples", type=int, default=SAMPLES, help=f"estimates per run, about (default {SAMPLES})"
    )
    parser.add_argument(
        "--limit-factor",
        type=float,
        default=LIMIT_FACTOR,
        help=f"limits as this many times each duration (default {LIMIT_FACTOR:g})",
    )
    args = parser.parse_args(argv)
    known = traces(args.seed, args.quick)
    names = list(known) if not args.trace else [x.strip() for x in args.trace.split(",")]
    for name in names:
        if name not in known:
            raise SystemExit(f"unknown trace {name!r}; choose from {', '.join(known)}")
    size = "quick" if args.quick else "full size"
    lines = [
        f"estimated start minus actual start, seconds (seed {args.seed}, {size}; "
        f"limits: {args.limit_factor:g}x duration)",
        f"{'trace':<12} {'policy':<12} {'limits':<7} {'waits':>7} {'unknown':>7} "
        f"{'mean':>9} {'p90':>9} {'mean|e|':>9} {'p90|e|':>9} {'every':>5} {'s':>6}",
    ]
    print(*lines, sep="\n", flush=True)
    for name in names:
        make, memory = known[name]
        tasks = make()
        for policy in POLICIES:
            for limited in (False, True):
                run = with_limits(tasks, args.limit_factor) if limited else tasks
                line = (
                    f"{name:<12} {policy:<12} {'yes' if limited else 'no':<7} "
                    f"{row(run, memory, policy, args.samples)}"
                )
                print(line, flush=True)
                lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
