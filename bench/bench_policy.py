"""Scheduling policies compared: makespan against the packing bound, and waits per demand class.

Every trace (the policy-flaw traces P1-P3 of issue 9 where this is a source checkout, the
bundled ``batch`` and ``embedding`` examples, and seeded generated ones: see
``_policy_traces``) runs on four GPUs in the simulator under every policy. Per trace and
policy: the makespan, its ratio to the packing bound (no schedule can beat the bound, so the
ratio is >= 1), and the p50/p99/max wait of each demand class. After the tables, one line
per aim of the new ``hwpool`` policy and per trace, "met" or "missed":

(a) makespan within 1.05x of the packing bound on every trace where first-fit gets there;
(b) the widest demand class's p99 wait not above that under ``hwpool-reserve-all`` or
    ``fifo``;
(c) the 4-GPU task of each ``stream-*`` trace starts while the stream still runs.

A benchmark prints; it never fails on a figure. Virtual time: the figures are the same on
every machine for one seed. Run: ``python bench/bench_policy.py`` (about 10 s on 2 vCPUs),
``--quick`` for traces a tenth the size, ``--trace P1,stream-70``, ``--policy fifo,hwpool``,
``--seed N``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # `hwpool bench` and `python bench/...` put it there; an import may not
    sys.path.insert(0, _HERE)

from _policy_traces import BIG, GPUS, all_traces  # noqa: E402
from hwpool._core._capacity import UNITS_PER_GPU  # noqa: E402
from hwpool._sim._simulate import (  # noqa: E402
    POLICIES,
    ClassStats,
    Outcome,
    TaskRun,
    class_stats,
    percentile,
    simulate,
)
from hwpool._sim._trace import Task  # noqa: E402

SEED = 9
NEAR = 1.05  # aim (a): makespan within this of the packing bound
MAX_CLASSES = 6  # more distinct demands than this are shown in ranges
_RANGES = ((0.1, "0-0.1"), (0.25, "0.1-0.25"), (0.5, "0.25-0.5"))  # (top, label); then 0.5-1


class Result(NamedTuple):
    """One trace under one policy (not a dataclass: ``hwpool bench`` loads this file as a
    module that is not in ``sys.modules``, where a dataclass cannot be made)."""

    outcome: Outcome
    classes: tuple[ClassStats, ...]


def classes_of(runs: Sequence[TaskRun]) -> tuple[ClassStats, ...]:
    """Wait statistics per demand class; with many distinct fractions (P3 has one per task),
    per range of fractions instead, smallest first."""
    exact = class_stats(runs)
    if len(exact) <= MAX_CLASSES:
        return exact
    waits: dict[tuple[int, float], list[float]] = {}
    labels: dict[tuple[int, float], str] = {}
    for run in runs:
        key, label = _range_of(run.task)
        waits.setdefault(key, []).append(run.wait)
        labels[key] = label
    return tuple(
        ClassStats(labels[key], len(w), percentile(w, 50), percentile(w, 99), max(w))
        for key, w in sorted(waits.items())
    )


def _range_of(task: Task) -> tuple[tuple[int, float], str]:
    """The range of demands ``task`` falls in, as a sortable key and a label."""
    if task.count > 1 or task.units == UNITS_PER_GPU:
        return (task.count, 1.0), task.label
    fraction = task.units / UNITS_PER_GPU
    for top, label in _RANGES:
        if fraction <= top:
            return (1, top), f"{label} GPU"
    return (1, 0.99), "0.5-1 GPU"


def run_all(traces: dict[str, list[Task]], policies: Sequence[str]) -> dict[str, dict[str, Result]]:
    """Simulate every trace under every policy."""
    results: dict[str, dict[str, Result]] = {}
    for name, tasks in traces.items():
        results[name] = {}
        for policy in policies:
            outcome = simulate(tasks, GPUS, policy)
            results[name][policy] = Result(outcome, classes_of(outcome.runs))
    return results


def _cell(stats: ClassStats) -> str:
    return f"{stats.p50:.1f}/{stats.p99:.1f}/{stats.worst:.1f}"


def table(name: str, tasks: Sequence[Task], results: dict[str, Result]) -> list[str]:
    """The lines of one trace's table: a title, a header, one row per policy."""
    first = next(iter(results.values()))
    bound = first.outcome.packing_bound
    labels = [stats.label for stats in first.classes]
    width = max(16, *(len(_cell(s)) + 2 for r in results.values() for s in r.classes))
    lines = [
        f"== {name}: {len(tasks)} tasks on {GPUS} GPUs, packing bound {bound:.1f} s "
        "(waits per class: p50/p99/max s)",
        f"{'policy':<20}{'makespan':>10}{'ratio':>9}  " + "".join(f"{x:>{width}}" for x in labels),
    ]
    for policy, result in results.items():
        outcome = result.outcome
        ratio = outcome.makespan / outcome.packing_bound
        cells = "".join(f"{_cell(stats):>{width}}" for stats in result.classes)
        lines.append(f"{policy:<20}{outcome.makespan:>10.1f}{ratio:>8.3f}x  {cells}")
    return lines


def _ratio(result: Result) -> float:
    return result.outcome.makespan / result.outcome.packing_bound


def aim_bound(results: dict[str, dict[str, Result]]) -> list[str]:
    """(a): hwpool within NEAR of the packing bound wherever first-fit gets there."""
    lines = [f"(a) hwpool's makespan within {NEAR:g}x of the packing bound where first-fit is:"]
    for name, by_policy in results.items():
        if "hwpool" not in by_policy or "first-fit" not in by_policy:
            lines.append(f"    {name}: n/a (needs hwpool and first-fit)")
            continue
        ours, ff = _ratio(by_policy["hwpool"]), _ratio(by_policy["first-fit"])
        if ff > NEAR:
            lines.append(f"    {name}: n/a (first-fit {ff:.3f}x)")
            continue
        verdict = "met" if ours <= NEAR else "missed"
        lines.append(f"    {name}: {verdict} (hwpool {ours:.3f}x, first-fit {ff:.3f}x)")
    return lines


def aim_widest(results: dict[str, dict[str, Result]]) -> list[str]:
    """(b): the widest class's p99 wait under hwpool not above reserve-all's or fifo's."""
    others = ("hwpool-reserve-all", "fifo")
    lines = ["(b) widest class's p99 wait under hwpool not above hwpool-reserve-all's or fifo's:"]
    for name, by_policy in results.items():
        if any(p not in by_policy for p in ("hwpool", *others)):
            lines.append(f"    {name}: n/a (needs hwpool, {', '.join(others)})")
            continue
        widest = {p: by_policy[p].classes[-1] for p in ("hwpool", *others)}
        ours = widest["hwpool"].p99
        verdict = "met" if all(ours <= widest[p].p99 + 1e-9 for p in others) else "missed"
        figures = ", ".join(f"{p} {widest[p].p99:.1f} s" for p in ("hwpool", *others))
        lines.append(f"    {name}: {verdict} ({widest['hwpool'].label}: {figures})")
    return lines


def aim_big(traces: dict[str, list[Task]], results: dict[str, dict[str, Result]]) -> list[str]:
    """(c): each stream's 4-GPU task starts under hwpool while the stream still runs."""
    lines = [f"(c) each stream's {GPUS}-GPU task starts under hwpool while the stream runs:"]
    for name, by_policy in results.items():
        if not name.startswith("stream-"):
            continue
        if "hwpool" not in by_policy:
            lines.append(f"    {name}: n/a (needs hwpool)")
            continue
        last = max(t.arrival for t in traces[name])
        (big,) = [r for r in by_policy["hwpool"].outcome.runs if r.task.name == BIG]
        verdict = "met" if big.start < last else "missed"
        lines.append(
            f"    {name}: {verdict} (started at {big.start:.1f} s after waiting {big.wait:.1f} s;"
            f" last arrival {last:.1f} s)"
        )
    return lines


def report(traces: dict[str, list[Task]], results: dict[str, dict[str, Result]], note: str) -> str:
    """The whole text: a title, each trace's table, then the aims."""
    lines = [f"scheduling policies in the simulator, {GPUS} GPUs ({note})"]
    for name, by_policy in results.items():
        lines += ["", *table(name, traces[name], by_policy)]
    lines += ["", *aim_bound(results), *aim_widest(results), *aim_big(traces, results)]
    return "\n".join(lines)


def _choose(given: str | None, known: Sequence[str], what: str) -> list[str]:
    if given is None or given == "all":
        return list(known)
    chosen = [x.strip() for x in given.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown[0]!r}; choose from {', '.join(known)}")
    return chosen


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its text and return it."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="generated traces 1/10 the size")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed (default {SEED})")
    parser.add_argument("--policy", help="comma-separated policies (default all)")
    parser.add_argument("--trace", help="comma-separated traces (default all)")
    args = parser.parse_args(argv)
    makers = all_traces(args.seed, args.quick)
    policies = _choose(args.policy, POLICIES, "policy")
    names = _choose(args.trace, list(makers), "trace")
    traces = {name: makers[name]() for name in names}
    results = run_all(traces, policies)
    size = "quick" if args.quick else "full size"
    text = report(traces, results, f"seed {args.seed}, {size}")
    print(text)
    return text


if __name__ == "__main__":
    main()
