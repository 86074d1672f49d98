"""Fair share between owners (issue 23): the flood, shares kept over a long mixed trace, cost.

Three parts, each against a baseline run in the same process:

1. The flood: owner A queues N one-GPU tasks of 10 s on four GPUs at t=0, then owner B
   submits one task at t=1 (4 GPUs, 2 GPUs, or a quarter GPU). B's wait with one owner for
   all (how hwpool behaved before owners: B is last in line) and with A and B as owners.
   Aim: B waits no more than one hold time (10 s) plus a little.
2. Shares: 3 and 4 owners with shares 1:2:3(:4), each offering 1.5 times the whole machine
   of mixed tasks (0.25/0.5/1/2 GPUs, exponential durations) for six hours, so every owner
   has work queued throughout. Per owner, its GPU-time over the window where all are
   backlogged, as a fraction of all, against its share; aim: within 5% (relative) of it.
   Utilisation over the window against the same trace with one owner (work-conserving).
   One owner alone (every task A's) gives exactly the schedule of no owners.
3. Cost: microseconds per release (one grant ends, the next starts) with 10,000 one-GPU
   waiters, by number of owners; the order between owners costs O(owners log owners).

A benchmark prints; it never fails on a figure. Parts 1-2 run in virtual time (the same
figures on every machine); part 3 is wall time. Run: ``python bench/bench_fairness.py``
(about a minute on 2 vCPUs), ``--quick`` for a shorter trace and fewer waiters.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # `hwpool bench` and `python bench/...` put it there; an import may not
    sys.path.insert(0, _HERE)

from hwpool._core._capacity import UNITS_PER_GPU  # noqa: E402
from hwpool._core._scheduler import Demand, Scheduler  # noqa: E402
from hwpool._sim._simulate import TaskRun, simulate  # noqa: E402
from hwpool._sim._trace import Task  # noqa: E402

GPUS = 4
HOLD = 10.0  # seconds each of A's flood tasks holds its GPU
SEED = 23
SHARE_AIM = 0.05  # part 2: each owner's fraction within 5% of its share
POLICIES = ("hwpool", "hwpool-reserve-all")


# ----------------------------------------------------------------- 1. the flood
def flood(queued: int, count: int, fraction: float, owners: bool) -> list[Task]:
    """A's ``queued`` one-GPU tasks at t=0, then B's one task at t=1."""
    a, b = ("A", "B") if owners else (None, None)
    tasks = [Task(f"a{i}", 0.0, 1, UNITS_PER_GPU, HOLD, None, a) for i in range(queued)]
    units = UNITS_PER_GPU if count > 1 else round(fraction * UNITS_PER_GPU)
    tasks.append(Task("b", 1.0, count, units, HOLD, None, b))
    return tasks


def b_wait(tasks: Sequence[Task], policy: str) -> float:
    outcome = simulate(tasks, GPUS, policy)
    return next(run.wait for run in outcome.runs if run.task.name == "b")


def part_flood(sizes: Sequence[int]) -> list[str]:
    lines = [
        "== 1. the flood: A queues N x (1 GPU, 10 s) at t=0 on 4 GPUs, B one task at t=1; "
        "B's wait (s)",
        f"{'policy':<20}{'N':>6}{'B asks':>10}{'one owner':>11}{'owners':>9}{'aim <= 10+':>12}",
    ]
    for policy in POLICIES:
        for queued in sizes:
            for count, fraction, label in (
                (4, 1.0, "4 GPUs"),
                (2, 1.0, "2 GPUs"),
                (1, 0.25, "0.25"),
            ):
                before = b_wait(flood(queued, count, fraction, owners=False), policy)
                after = b_wait(flood(queued, count, fraction, owners=True), policy)
                verdict = "met" if after <= HOLD + 1.0 else "missed"
                lines.append(
                    f"{policy:<20}{queued:>6}{label:>10}{before:>11.1f}{after:>9.1f}{verdict:>12}"
                )
    return lines


# ----------------------------------------------------------------- 2. shares
_SIZES = ((0.25, 0.3), (0.5, 0.3), (1.0, 0.3), (2.0, 0.1))  # (GPUs, probability)
_MEAN_S = 30.0


def mixed(rng: random.Random, owners: Sequence[str], horizon: float) -> list[Task]:
    """Each owner offers 1.5 times the machine for ``horizon`` seconds: a Poisson stream of
    mixed tasks with exponential durations (mean 30 s, at least 1 s)."""
    mean_gpus = sum(size * p for size, p in _SIZES)
    rate = 1.5 * GPUS / (mean_gpus * _MEAN_S)  # tasks per second per owner
    tasks: list[Task] = []
    for owner in owners:
        now = 0.0
        while True:
            now += rng.expovariate(rate)
            if now >= horizon:
                break
            size = rng.choices([s for s, _ in _SIZES], [p for _, p in _SIZES])[0]
            count, units = (
                (int(size), UNITS_PER_GPU) if size >= 1 else (1, round(size * UNITS_PER_GPU))
            )
            duration = max(1.0, rng.expovariate(1.0 / _MEAN_S))
            tasks.append(Task(f"{owner}{len(tasks)}", now, count, units, duration, None, owner))
    return sorted(tasks, key=lambda task: task.arrival)


def gpu_time(runs: Sequence[TaskRun], start: float, end: float) -> dict[str | None, float]:
    """GPU-seconds each owner held within [start, end]."""
    held: dict[str | None, float] = {}
    for run in runs:
        overlap = min(run.end, end) - max(run.start, start)
        if overlap > 0:
            gpus = run.task.count * run.task.units / UNITS_PER_GPU
            held[run.task.owner] = held.get(run.task.owner, 0.0) + gpus * overlap
    return held


def backlogged_until(runs: Sequence[TaskRun]) -> float:
    """When the first owner runs out of queued work: the earliest of the owners' last starts."""
    last: dict[str | None, float] = {}
    for run in runs:
        last[run.task.owner] = max(last.get(run.task.owner, 0.0), run.start)
    return min(last.values())


def part_shares(horizon: float, half_lives: Sequence[float]) -> list[str]:
    lines = [
        f"== 2. shares: owners each offering 1.5x the machine of mixed tasks for {horizon:g} s; "
        "GPU-time per owner while all have work queued",
    ]
    for shares in ((1.0, 2.0, 3.0), (1.0, 2.0, 3.0, 4.0)):
        owners = [f"u{i + 1}" for i in range(len(shares))]
        tasks = mixed(random.Random(SEED), owners, horizon)
        anonymous = [Task(t.name, t.arrival, t.count, t.units, t.duration) for t in tasks]
        for policy in POLICIES:
            single = simulate(anonymous, GPUS, policy)
            for half_life in half_lives:
                lines += share_rows(tasks, policy, dict(zip(owners, shares, strict=True)),
                                    half_life, single.runs)  # fmt: skip
    return lines


def share_rows(
    tasks: Sequence[Task],
    policy: str,
    shares: dict[str, float],
    half_life: float,
    single: Sequence[TaskRun],
) -> list[str]:
    outcome = simulate(tasks, GPUS, policy, shares=shares, half_life=half_life)
    end = backlogged_until(outcome.runs)
    start = min(600.0, end / 10)
    held = gpu_time(outcome.runs, start, end)
    total, weight = sum(held.values()), sum(shares.values())
    worst = 0.0
    cells = []
    for owner, share in shares.items():
        got, aim = held.get(owner, 0.0) / total, share / weight
        worst = max(worst, abs(got / aim - 1.0))
        cells.append(f"{owner} {got:.3f}/{aim:.3f}")
    base = sum(gpu_time(single, start, end).values())
    verdict = "met" if worst <= SHARE_AIM else "missed"
    ratio = ":".join(f"{s:g}" for s in shares.values())
    return [
        f"  {policy:<19} shares {ratio:<8} half-life {half_life:>6g} s, window "
        f"{start:.0f}-{end:.0f} s: " + ", ".join(cells) + f" (got/share); worst {worst:.1%} "
        f"({verdict}); utilisation {total / (GPUS * (end - start)):.3f} vs one owner "
        f"{base / (GPUS * (end - start)):.3f}"
    ]


def part_alone(horizon: float) -> list[str]:
    """One owner alone: the very schedule of no owners."""
    tasks = mixed(random.Random(SEED), ["solo"], horizon)
    anonymous = [Task(t.name, t.arrival, t.count, t.units, t.duration) for t in tasks]
    lines = []
    for policy in POLICIES:
        mine = [(r.start, r.gpus) for r in simulate(tasks, GPUS, policy).runs]
        none = [(r.start, r.gpus) for r in simulate(anonymous, GPUS, policy).runs]
        same = "identical" if mine == none else "DIFFERENT"
        lines.append(f"  {policy:<19} one owner alone ({len(tasks)} tasks): schedule {same} "
                     "to no owners")  # fmt: skip
    return lines


# ----------------------------------------------------------------- 3. cost
def release_us(waiters: int, owners: int, rounds: int = 2000) -> float:
    """Microseconds per release on a full 4-GPU core with ``waiters`` one-GPU waiters from
    ``owners`` owners (None when 1), each release granting the next waiter."""
    core = Scheduler(GPUS)
    if owners == 1:  # no owner named: as before owners (and it runs on that core too)
        demands = [Demand(1, UNITS_PER_GPU)]
    else:
        demands = [Demand(1, UNITS_PER_GPU, owner=f"o{i}") for i in range(owners)]
    held = []
    for i in range(GPUS + waiters):
        _, grant = core.submit(demands[i % owners], now=0.0)
        if grant is not None:
            held.append(grant)
    now = 1.0
    rounds = min(rounds, waiters)
    started = time.perf_counter()
    for _ in range(rounds):
        grant = held.pop(0)
        now += 0.01
        held += core.release(grant.gpus[0], grant.units, ticket=grant.ticket, now=now)
    return (time.perf_counter() - started) / rounds * 1e6


def part_cost(waiters: int) -> list[str]:
    lines = [f"== 3. cost: us per release with {waiters} one-GPU waiters (wall time, best of 3)"]
    base = min(release_us(waiters, 1) for _ in range(3))
    for owners in (1, 3, 10, 30):
        us = base if owners == 1 else min(release_us(waiters, owners) for _ in range(3))
        lines.append(f"  {owners:>3} owners: {us:7.1f} us  ({us / base:.2f}x one owner)")
    return lines


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its text and return it."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter trace, fewer waiters")
    args = parser.parse_args(argv)
    horizon = 3600.0 if args.quick else 6 * 3600.0
    lines = part_flood((200,) if args.quick else (200, 1000))
    lines.append("")
    lines += part_shares(horizon, (3600.0,) if args.quick else (600.0, 3600.0))
    lines += part_alone(horizon)
    lines.append("")
    lines += part_cost(1000 if args.quick else 10_000)
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
