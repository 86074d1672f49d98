"""The simulator's measure of the estimated starts (``_sim/_estimates``): it makes the
simulator's very schedule, records an estimate for each task that waited (worked by hand on
a small trace), and sums them up."""

from __future__ import annotations

import random

import pytest

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._sim._estimates import Estimate, estimate_stats, measure_estimates, with_limits
from hwpool._sim._simulate import simulate
from hwpool._sim._trace import Task

WHOLE = UNITS_PER_GPU


def _tasks(n: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    tasks, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(2.0)
        count, units = rng.choice([(1, WHOLE // 4), (1, WHOLE // 2), (1, WHOLE), (2, WHOLE)])
        tasks.append(Task(f"t{i}", t, count, units, rng.uniform(0.5, 3.0)))
    return tasks


@pytest.mark.parametrize(
    ("policy", "name"), [("easy", "hwpool-limits"), ("reserve-all", "hwpool-reserve-all")]
)
@pytest.mark.parametrize("limited", [False, True])
def test_the_measure_makes_the_simulators_schedule(policy: str, name: str, limited: bool) -> None:
    tasks = _tasks(120, 5)
    if limited:
        tasks = with_limits(tasks, 1.5)
    found = measure_estimates(tasks, 2, policy)
    starts = {run.task.name: run.start for run in simulate(tasks, 2, name).runs}
    waited = [task for task in tasks if starts[task.name] > task.arrival]
    assert [e.task for e in found] == waited
    assert all(e.actual == starts[e.task.name] for e in found)
    if limited:
        assert all(e.estimated is not None for e in found)
    assert [e.task for e in measure_estimates(tasks, 2, policy, every=3)] == waited[::3]


def test_estimates_are_the_plan_at_submission() -> None:
    # One GPU; a holds it 0-4 (limit 5), b waits from 1 (limit 2): planned at a's limit, 5;
    # it starts at 4, so its error is +1. c waits from 2 behind b: planned at 5 + 2 = 7, and
    # starts at 4 + 1 = 5 (b ran 1 s).
    tasks = [
        Task("a", 0.0, 1, WHOLE, 4.0, limit=5.0),
        Task("b", 1.0, 1, WHOLE, 1.0, limit=2.0),
        Task("c", 2.0, 1, WHOLE, 1.0, limit=2.0),
    ]
    found = measure_estimates(tasks, 1, "easy")
    assert [(e.task.name, e.estimated, e.actual) for e in found] == [
        ("b", 5.0, 4.0),
        ("c", 7.0, 5.0),
    ]
    stats = estimate_stats(found)
    assert (stats.waited, stats.unknown, stats.mean_error, stats.mean_abs) == (2, 0, 1.5, 1.5)
    unlimited = [Task(t.name, t.arrival, t.count, t.units, t.duration) for t in tasks]
    assert [e.estimated for e in measure_estimates(unlimited, 1, "easy")] == [None, None]


def test_stats_count_unknown_estimates_apart() -> None:
    task = Task("x", 0.0, 1, WHOLE, 1.0)
    stats = estimate_stats(
        [Estimate(task, None, 3.0), Estimate(task, 5.0, 3.0), Estimate(task, 1.0, 3.0)]
    )
    assert (stats.waited, stats.unknown, stats.mean_error, stats.mean_abs) == (3, 1, 0.0, 2.0)
    assert estimate_stats([Estimate(task, None, 1.0)]).unknown == 1


def test_with_limits_gives_each_task_without_one_a_limit_of_its_duration_times_the_factor() -> None:
    tasks = [Task("a", 0.0, 1, WHOLE, 2.0), Task("b", 0.0, 1, WHOLE, 2.0, limit=1.0)]
    assert [t.limit for t in with_limits(tasks, 3.0)] == [6.0, 1.0]
