"""How honest the core's estimated starts are: a trace replayed in virtual time, each waiting
task's estimate (:func:`hwpool._core._explain.explain`) taken when it is submitted and
compared with when it really starts.

The event loop is the simulator's (:func:`~hwpool._sim._simulate.simulate`: completions
before arrivals at one instant, arrivals in trace order), driving the core directly so that
it knows each running grant's start and demand, as the host server's books do; the schedule
it makes is the simulator's, which a test checks.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from .._core._explain import MAX_EVENTS, Running, explain
from .._core._scheduler import Grant, Scheduler
from ._machine import task_demand
from ._simulate import percentile
from ._trace import Task

__all__ = ["Estimate", "EstimateStats", "estimate_stats", "measure_estimates", "with_limits"]

_COMPLETION, _ARRIVAL = 0, 1


@dataclass(frozen=True, slots=True)
class Estimate:
    """One task that waited: when it came, the start estimated then (None: unknown) and
    when it really started."""

    task: Task
    estimated: float | None
    actual: float

    @property
    def error(self) -> float | None:
        """Estimated minus actual start (seconds; > 0: it started sooner than estimated)."""
        return None if self.estimated is None else self.estimated - self.actual


@dataclass(frozen=True, slots=True)
class EstimateStats:
    """The estimates of one schedule: how many tasks waited, how many of their estimates
    were unknown, and the mean and 90th percentile of the signed error and of its size."""

    waited: int
    unknown: int
    mean_error: float
    p90_error: float
    mean_abs: float
    p90_abs: float


def measure_estimates(
    tasks: Sequence[Task],
    num_gpus: int,
    policy: str = "easy",
    *,
    backfill: str = "limits",
    gpu_memory: Sequence[int] | None = None,
    max_events: int = MAX_EVENTS,
    every: int = 1,
) -> list[Estimate]:
    """Replay ``tasks`` on ``num_gpus`` GPUs under the core's ``policy`` and ``backfill``
    (``gpu_memory``: each GPU's MiB, as :func:`~hwpool._sim._simulate.simulate` takes it);
    for each task that waits (``every``: each ``every``-th of them, the first included: an
    explanation replays the queue, which costs in proportion to it), its estimate at
    submission and its actual start."""
    totals = None if gpu_memory is None else tuple(gpu_memory)
    core = Scheduler(num_gpus if totals is None else totals, policy=policy, backfill=backfill)
    demands = [task_demand(task, totals) for task in tasks]
    events = [(task.arrival, _ARRIVAL, i) for i, task in enumerate(tasks)]
    heapq.heapify(events)
    task_of: dict[int, int] = {}
    running: dict[int, Running] = {}  # by task
    estimated: dict[int, float | None] = {}
    actual: dict[int, float] = {}
    waits = 0

    def started(grants: list[Grant], now: float) -> None:
        for grant in grants:
            index = task_of.pop(grant.ticket)
            running[index] = Running(grant, now, demands[index])
            actual[index] = now
            heapq.heappush(events, (now + tasks[index].runtime, _COMPLETION, index))

    while events:
        now, kind, index = heapq.heappop(events)
        if kind == _COMPLETION:
            ended = running.pop(index).grant
            started(core.release_many(core.held(ended), ticket=ended.ticket, now=now), now)
            continue
        ticket, grant = core.submit(demands[index], now=now)
        task_of[ticket] = index
        if grant is not None:
            started([grant], now)
            continue
        waits += 1
        if (waits - 1) % every:
            continue
        found = explain(core, running.values(), now=now, max_events=max_events)
        estimated[index] = next(e.start for e in found if e.ticket == ticket)
    return [Estimate(tasks[i], estimated[i], actual[i]) for i in sorted(estimated)]


def estimate_stats(estimates: Sequence[Estimate]) -> EstimateStats:
    """The figures of :func:`measure_estimates`' result (errors of 0 where none is known)."""
    errors = [e.error for e in estimates if e.error is not None]
    sizes = [abs(error) for error in errors]
    if not errors:
        return EstimateStats(len(estimates), len(estimates), 0.0, 0.0, 0.0, 0.0)
    return EstimateStats(
        waited=len(estimates),
        unknown=len(estimates) - len(errors),
        mean_error=sum(errors) / len(errors),
        p90_error=percentile(errors, 90),
        mean_abs=sum(sizes) / len(sizes),
        p90_abs=percentile(sizes, 90),
    )


def with_limits(tasks: Sequence[Task], factor: float) -> list[Task]:
    """``tasks``, each given a limit of ``factor`` times its duration where it has none
    (``factor >= 1``: never cut short), as users who set ``--time`` with room to spare."""
    return [
        task if task.limit is not None else dataclasses.replace(task, limit=task.duration * factor)
        for task in tasks
    ]
