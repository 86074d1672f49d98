"""Record the golden schedules: ``python tests/sim/golden/record.py`` rewrites the fixtures.

Each fixture pins, for one trace, what every simulator policy decides on each machine it can
run on: per task its start time and GPUs, and the summary figures. ``test_sim_golden.py``
replays the same cases and compares exactly, so a change to the scheduler core that changes
any decision fails it. Rewrite the fixtures only for a change meant to change decisions.

A second fixture pins the core driven directly (``core-scripts.json``): seeded random
submits, releases, cancels and withholds under limits, groups and memory groups, which the
simulator does not reach.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._limits import LimitExceeded, OwnerLimits
from hwpool._core._scheduler import Demand, Grant, Scheduler
from hwpool._sim._names import POLICIES
from hwpool._sim._simulate import Outcome, simulate
from hwpool._sim._trace import Task, load_trace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import _policy_traces  # noqa: E402

GPUS = 4
GIB = 1024
UNEQUAL = (80 * GIB, 80 * GIB, 40 * GIB, 24 * GIB)
"""An unequal machine for the traces written in fractions (they become relative demands)."""
SERVING = (80 * GIB, 24 * GIB)
"""The machine the bundled model-serving trace is written for."""
SEEDS = (1, 2)
SHARES = {"a": 2.0, "b": 1.0}


def _owned(rng: random.Random, tasks: list[Task]) -> list[Task]:
    """``tasks`` given owners, priorities and (some) limits, for rules 8-11 of the core."""
    out = []
    for task in tasks:
        limit = task.duration * rng.choice((1.0, 1.5, 0.8)) if rng.random() < 0.3 else None
        out.append(
            Task(
                task.name, task.arrival, task.count, task.units, task.duration,
                task.memory_mib, rng.choice(("a", "b", "c")), rng.choice((0, 0, 1, -1)), limit,
            )
        )  # fmt: skip
    return out


def traces() -> dict[str, tuple[Callable[[], list[Task]], tuple[tuple[int, ...] | None, ...]]]:
    """Every golden trace by name, with the machines (GPU totals; None: fractions) it runs on."""
    both: tuple[tuple[int, ...] | None, ...] = (None, UNEQUAL)
    cases: dict[str, Any] = {}
    for name in _policy_traces.FLAWS:
        path = str(_policy_traces.FLAW_DIR / f"{name}.csv")
        cases[name] = (lambda p=path: load_trace(p, max_gpus=GPUS), both)
    cases["batch"] = (lambda: load_trace("batch", max_gpus=GPUS), both)
    cases["embedding"] = (lambda: load_trace("embedding", max_gpus=GPUS), both)
    cases["serving"] = (lambda: load_trace("serving"), (SERVING,))
    for name, make in _policy_traces.generated(SEEDS[0], quick=True).items():
        cases[f"{name}-s{SEEDS[0]}"] = (make, both)
    for seed in SEEDS:
        rng = random.Random(seed)
        make = _policy_traces.generated(seed, quick=True)["heavy-tail"]
        cases[f"owned-s{seed}"] = (lambda m=make, r=rng: _owned(r, m()), both)
    return cases


def summary(outcome: Outcome) -> dict[str, Any]:
    """An outcome as JSON: each task's start and GPUs in trace order, and the figures."""
    return {
        "runs": [f"{run.start!r}@{','.join(map(str, run.gpus))}" for run in outcome.runs],
        "makespan": outcome.makespan,
        "utilization": outcome.utilization,
        "classes": [[c.label, c.count, c.p50, c.p99, c.worst] for c in outcome.classes],
        "owners": [[c.label, c.count, c.p50, c.p99, c.worst] for c in outcome.owners],
    }


def record_trace(make: Callable[[], list[Task]], machines: tuple[Any, ...]) -> dict[str, Any]:
    """Every policy's schedule of one trace on each of ``machines``."""
    tasks = make()
    result: dict[str, Any] = {}
    for machine in machines:
        where = "equal" if machine is None else ",".join(map(str, machine))
        gpus = GPUS if machine is None else len(machine)
        for policy in POLICIES:
            shares = SHARES if any(task.owner for task in tasks) else None
            outcome = simulate(tasks, gpus, policy, gpu_memory=machine, shares=shares)
            result[f"{where}/{policy}"] = summary(outcome)
    return result


# ----------------------------------------------------------------- the core driven directly
CONFIGS: dict[str, dict[str, Any]] = {
    "plain": {"gpus": 4},
    "unequal": {"gpus": [100, 100, 60, 40]},
    "limits": {
        "gpus": 4,
        "limits": {"a": OwnerLimits(gpus=2.0, queued=6), "b": OwnerLimits(running=2)},
        "default_limits": OwnerLimits(units=3 * UNITS_PER_GPU // 2),
    },
    "limits-refuse": {
        "gpus": [100, 100, 60, 40],
        "limits": {"a": OwnerLimits(gpus=2.5, mode="refuse"), "b": OwnerLimits(units=150)},
    },
    "groups": {"gpus": 6, "groups": ["x", "x", "x", "y", "y", "z"]},
    "memory": {"gpus": [100, 100, 100, 80], "memory_groups": ["m", "m", None, None]},
    "all": {
        "gpus": [100, 100, 100, 100, 50, 50],
        "groups": ["x", "x", "x", "y", "y", "y"],
        "memory_groups": [None, "m", "m", None, None, None],
        "limits": {"c": OwnerLimits(gpus=1.5, running=3)},
    },
}


CORE_POLICIES = (("easy", "limits"), ("easy", "estimates"), ("reserve-all", "limits"))
STEPS = 200


def _demand(rng: random.Random, core: Scheduler) -> Demand:
    owner = rng.choice((None, "a", "b", "c"))
    priority = rng.choice((0, 0, 0, 1, -1))
    limit = rng.choice((None, None, 2.0, 7.5))
    kind = rng.random()
    largest = max(core.totals)
    if kind < 0.15:
        count = rng.choice((2, 2, 3))
        return Demand(count, largest, owner=owner, priority=priority, limit=limit)
    if kind < 0.25:
        return Demand(1, largest, whole=True, owner=owner, priority=priority, limit=limit)
    if kind < 0.4 and len(set(core.totals)) > 1:
        units = rng.randint(1, UNITS_PER_GPU)
        return Demand(1, units, relative=True, owner=owner, priority=priority, limit=limit)
    units = rng.randint(1, min(core.totals) if rng.random() < 0.8 else largest)
    return Demand(1, units, owner=owner, priority=priority, limit=limit)


def _grant(grant: Grant) -> str:
    return f"{grant.ticket}@{','.join(map(str, grant.gpus))}x{grant.units}"


def script(name: str, policy: str, backfill: str, seed: int, steps: int) -> list[Any]:
    """What the core answers to ``steps`` seeded random calls, one entry per call."""
    rng = random.Random(seed)
    config = dict(CONFIGS[name])
    core = Scheduler(config.pop("gpus"), policy=policy, backfill=backfill, **config)
    held: dict[int, Grant] = {}
    log: list[Any] = []
    now = 0.0

    def took(grants: list[Grant]) -> list[str]:
        for grant in grants:
            held[grant.ticket] = grant
        return [_grant(grant) for grant in grants]

    for _ in range(steps):
        now += rng.choice((0.0, 0.5, 1.0, 3.0))
        action = rng.random()
        try:
            if action < 0.45 or not (held or core.queue_length):
                demand = _demand(rng, core)
                expected = rng.choice((None, None, 1.0, 5.0))
                if rng.random() < 0.2:
                    grant = core.grant_now(demand, now=now, expected=expected)
                    log.append(["now", took([] if grant is None else [grant])])
                else:
                    ticket, grant = core.submit(demand, now=now, expected=expected)
                    log.append(["submit", ticket, took([] if grant is None else [grant])])
            elif action < 0.8 and held:
                ticket = rng.choice(sorted(held))
                grant = held.pop(ticket)
                log.append(["release", ticket, took(core.release_granted(grant, now=now))])
            elif action < 0.9 and core.queue_length:
                ticket = rng.choice([w.ticket for w in core.waiters()])
                log.append(["cancel", ticket, took(core.cancel(ticket, now=now))])
            elif action < 0.92:
                books = [(t, core.held(g)) for t, g in held.items()]
                waiting = [(w.ticket, w.demand, None) for w in core.waiters()]
                log.append(["rebuild", took(core.rebuild(books, waiting, now=now))])
            else:
                gpu = rng.randrange(core.num_gpus)
                units = rng.choice((0, 0, core.totals[gpu] // 4))
                log.append(["withhold", gpu, units, took(core.withhold(gpu, units, now=now))])
        except LimitExceeded as exc:
            log.append(["refused", exc.owner, exc.limit])
        except ValueError as exc:
            log.append(["error", str(exc)])
        reserved = sorted(core.reservations().items())
        waiting = [f"{w.ticket}{'' if w.held is None else w.held.limit[0]}" for w in core.waiters()]
        log.append(f"{core.free} r{' '.join(f'{t}:{g}' for t, g in reserved)} w{' '.join(waiting)}")
    return log


def scripts() -> dict[str, Any]:
    """Every core script's log by ``config/policy/backfill/seed``."""
    result: dict[str, Any] = {}
    for name in CONFIGS:
        for policy, backfill in CORE_POLICIES:
            for seed in SEEDS:
                key = f"{name}/{policy}/{backfill}/{seed}"
                result[key] = script(name, policy, backfill, seed, STEPS)
    return result


def main() -> None:
    for name, (make, machines) in traces().items():
        path = HERE / f"{name}.json"
        path.write_text(json.dumps(record_trace(make, machines), separators=(",", ":")) + "\n")
        print(f"wrote {path.name}")
    (HERE / "core-scripts.json").write_text(json.dumps(scripts(), separators=(",", ":")) + "\n")
    print("wrote core-scripts.json")


if __name__ == "__main__":
    main()
