"""Virtual-time simulation of a workload through the hwpool scheduler core (or a baseline).

An event queue of arrivals and completions, nothing else: no clock, no threads, no sleeping, so
a day of workload replays in milliseconds and the same trace always gives the same schedule.
The ``hwpool`` policy is the very :class:`~hwpool._scheduler.Scheduler` that GPUPool drives.
At one instant, completions are handled before arrivals, and arrivals in trace order.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .._core._capacity import UNITS_PER_GPU
from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._scheduler import Demand
from ._baselines import CorePolicy, ShortestQueuePolicy, Start
from ._machine import held_on, min_work, run_work, task_demand
from ._names import POLICIES
from ._trace import Task

__all__ = [
    "POLICIES",
    "ClassStats",
    "FairShare",
    "Outcome",
    "TaskRun",
    "class_stats",
    "lower_bound",
    "outcome",
    "owner_stats",
    "packing_bound",
    "percentile",
    "simulate",
]

_COMPLETION, _ARRIVAL = 0, 1  # event order at one instant


CORE_POLICIES = {
    "hwpool": ("easy", "estimates"),
    "hwpool-limits": ("easy", "limits"),
    "hwpool-reserve-all": ("reserve-all", "limits"),
    "fifo": ("fifo", "limits"),
    "first-fit": ("first-fit", "limits"),
}
"""The simulator's policies that are the core's: its policy and backfill rule. ``hwpool``
is GPUPool's default (``backfill="estimates"``), ``hwpool-limits`` the host server's."""


class Policy(Protocol):
    """A scheduling rule, as the event loop sees it."""

    def submit(self, task: int, demand: Demand, now: float = 0.0) -> list[Start]: ...

    def finish(self, task: int, now: float = 0.0) -> list[Start]: ...


def make_policy(
    name: str,
    num_gpus: int,
    totals: Sequence[int] | None = None,
    *,
    shares: Mapping[Hashable, float] | None = None,
    half_life: float = DEFAULT_HALF_LIFE,
) -> Policy:
    """A fresh policy by name (one of :data:`POLICIES`); ``totals``: GPUs sized in memory;
    ``shares``, ``half_life``: the hwpool policies' fair share (the baselines have none)."""
    if name == "shortest-queue":
        return ShortestQueuePolicy(num_gpus, UNITS_PER_GPU, totals)
    if name not in CORE_POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {name!r}")
    core_policy, backfill = CORE_POLICIES[name]
    return CorePolicy(
        num_gpus,
        UNITS_PER_GPU,
        totals,
        core_policy,
        shares=shares,
        half_life=half_life,
        backfill=backfill,
    )


@dataclass(frozen=True, slots=True)
class FairShare:
    """The fair share the hwpool policies apply between owners: ``shares`` (owner -> share,
    default 1 each) and ``half_life`` (seconds)."""

    shares: Mapping[Hashable, float] = dataclasses.field(default_factory=dict)
    half_life: float = DEFAULT_HALF_LIFE


@dataclass(frozen=True, slots=True)
class TaskRun:
    """When and where one task ran."""

    task: Task
    start: float
    end: float
    gpus: tuple[int, ...]
    share: float | None = None
    """On a machine sized in memory: the share of each of its GPUs it held (else None: the
    task's fraction says it)."""

    @property
    def wait(self) -> float:
        """Seconds from arrival to start."""
        return self.start - self.task.arrival


@dataclass(frozen=True, slots=True)
class ClassStats:
    """Waits of one demand class: how many tasks, median, 99th percentile and worst."""

    label: str
    count: int
    p50: float
    p99: float
    worst: float


@dataclass(frozen=True, slots=True)
class Outcome:
    """A schedule and its figures: makespan against its lower bound, and GPU utilisation.

    ``utilization`` is the work (GPU-seconds) over ``num_gpus`` times the span from the first
    arrival to the makespan; ``best_utilization`` is the same at the lower bound.
    ``packing_bound`` is a tighter bound that also counts that tasks above half a GPU never
    share one (see :func:`packing_bound`).
    """

    policy: str
    num_gpus: int
    runs: tuple[TaskRun, ...]
    makespan: float
    lower_bound: float
    packing_bound: float
    utilization: float
    best_utilization: float
    classes: tuple[ClassStats, ...]
    gpu_memory: tuple[int, ...] | None = None
    """Each GPU's MiB on a machine sized in memory (work then counts MiB-seconds)."""
    owners: tuple[ClassStats, ...] = ()
    """Waits per owner (labelled by owner; tasks without one are "(none)") when the tasks
    have more than one owner; else empty."""


def simulate(
    tasks: Sequence[Task],
    num_gpus: int,
    policy: str = "hwpool",
    *,
    progress: Callable[[int], None] | None = None,
    gpu_memory: Sequence[int] | None = None,
    shares: Mapping[Hashable, float] | None = None,
    half_life: float = DEFAULT_HALF_LIFE,
) -> Outcome:
    """Replay ``tasks`` on ``num_gpus`` GPUs under ``policy`` in virtual time.

    ``shares`` (owner -> share) and ``half_life`` (seconds): the hwpool policies' fair share
    between the tasks' owners (see the scheduler core, rules 8-10e).

    ``progress``, if given, hears the number of tasks started so far, about every 1% of them.
    ``gpu_memory``: each GPU's MiB (``num_gpus`` of them), for a machine sized in memory (see
    ``_machine``). Raises ValueError, naming the task, for a task that needs more GPUs than
    there are, or that the machine cannot express (see ``_machine.task_demand``).
    """
    totals = None if gpu_memory is None else tuple(gpu_memory)
    if totals is not None and len(totals) != num_gpus:
        raise ValueError(f"gpu_memory lists {len(totals)} GPUs but num_gpus={num_gpus}")
    rule = make_policy(policy, num_gpus, totals, shares=shares, half_life=half_life)
    for task in tasks:
        if task.count > num_gpus:
            raise ValueError(f"task {task.name!r} needs {task.count} GPUs but gpus={num_gpus}")
    demands = [task_demand(task, totals) for task in tasks]
    events = [(task.arrival, _ARRIVAL, i) for i, task in enumerate(tasks)]
    heapq.heapify(events)
    started: dict[int, tuple[float, tuple[int, ...]]] = {}
    step = max(1, len(tasks) // 100)
    report = step if progress is not None else len(tasks) + 1
    while events:
        now, kind, index = heapq.heappop(events)
        if kind == _ARRIVAL:
            starts = rule.submit(index, demands[index], now)
        else:
            starts = rule.finish(index, now)
        for begun, gpus in starts:
            started[begun] = (now, gpus)
            heapq.heappush(events, (now + tasks[begun].runtime, _COMPLETION, begun))
        if len(started) >= report and progress is not None:
            progress(len(started))
            report = len(started) + step
    if len(started) != len(tasks):
        raise RuntimeError(f"policy {policy!r} left {len(tasks) - len(started)} tasks unstarted")
    runs = [
        TaskRun(
            task, started[i][0], started[i][0] + task.runtime, started[i][1],
            None if totals is None else _share(demands[i], started[i][1], totals),
        )
        for i, task in enumerate(tasks)
    ]  # fmt: skip
    return outcome(policy, num_gpus, runs, gpu_memory=totals)


def outcome(
    policy: str,
    num_gpus: int,
    runs: Sequence[TaskRun],
    *,
    gpu_memory: Sequence[int] | None = None,
) -> Outcome:
    """The figures of a finished schedule (simulated or measured).

    On a machine sized in memory, work and capacity are in MiB-seconds (``gpu_memory``).
    """
    tasks = [run.task for run in runs]
    makespan = max(run.end for run in runs)
    first = min(task.arrival for task in tasks)
    if gpu_memory is None:
        bound = lower_bound(tasks, num_gpus)
        work = sum(task.gpu_seconds for task in tasks)
        size = float(num_gpus)
    else:
        bound = memory_lower_bound(tasks, gpu_memory)
        work = sum(run_work(run.task, run.gpus, gpu_memory) for run in runs)
        size = float(sum(gpu_memory))
    return Outcome(
        policy=policy,
        num_gpus=num_gpus,
        runs=tuple(runs),
        makespan=makespan,
        lower_bound=bound,
        packing_bound=bound if gpu_memory is not None else packing_bound(tasks, num_gpus),
        utilization=_ratio(work, size * (makespan - first)),
        best_utilization=_ratio(work, size * (bound - first)),
        classes=class_stats(runs),
        gpu_memory=None if gpu_memory is None else tuple(gpu_memory),
        owners=owner_stats(runs),
    )


def _ratio(work: float, capacity: float) -> float:
    return min(1.0, work / capacity) if capacity > 0 else 1.0


def lower_bound(tasks: Sequence[Task], num_gpus: int) -> float:
    """A makespan no schedule can beat.

    The larger of: the latest ``arrival + duration``; and, for every arrival time ``a``, ``a``
    plus the work arriving at or after ``a`` spread perfectly over all GPUs.
    """
    return _spread_bound(tasks, num_gpus, lambda task: task.gpu_seconds)


def packing_bound(tasks: Sequence[Task], num_gpus: int) -> float:
    """A makespan no schedule can beat, counting that big tasks never share a GPU.

    A task above half a GPU, and each GPU of a whole-GPU task, holds a GPU that no other such
    task can use meanwhile: so at most ``num_gpus`` of them run at once, and their durations
    (not their fractions) spread over the GPUs bound the makespan as the work does in
    :func:`lower_bound`. The larger of the two bounds (1000 tasks of 0.6 GPU for 1 s on four
    GPUs: 250 s, where the work alone says 150 s).
    """

    def exclusive(task: Task) -> float:
        if task.count > 1 or 2 * task.units > UNITS_PER_GPU:
            return task.count * task.runtime
        return 0.0

    return max(lower_bound(tasks, num_gpus), _spread_bound(tasks, num_gpus, exclusive))


def _spread_bound(tasks: Sequence[Task], num_gpus: int, cost: Callable[[Task], float]) -> float:
    """The latest ``arrival + duration``, or for any arrival time ``a``, ``a`` plus the
    ``cost`` (GPU-seconds) of what arrives at or after ``a`` spread over all GPUs."""
    ordered = sorted(tasks, key=lambda task: task.arrival)
    bound = max(task.arrival + task.runtime for task in ordered)
    remaining = 0.0
    for task in reversed(ordered):
        remaining += cost(task)
        bound = max(bound, task.arrival + remaining / num_gpus)
    return bound


def _share(demand: Demand, gpus: tuple[int, ...], totals: Sequence[int]) -> float:
    return 1.0 if demand.whole else held_on(demand, totals[gpus[0]]) / totals[gpus[0]]


def memory_lower_bound(tasks: Sequence[Task], gpu_memory: Sequence[int]) -> float:
    """:func:`lower_bound` on GPUs sized in memory: each task's MiB-seconds spread over all
    the machine's MiB."""
    ordered = sorted(tasks, key=lambda task: task.arrival)
    bound = max(task.arrival + task.runtime for task in ordered)
    capacity, remaining = sum(gpu_memory), 0.0
    for task in reversed(ordered):
        remaining += min_work(task, gpu_memory)
        bound = max(bound, task.arrival + remaining / capacity)
    return bound


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of non-empty ``values``."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], got {q!r}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def class_stats(runs: Sequence[TaskRun]) -> tuple[ClassStats, ...]:
    """Wait statistics per demand class, smallest demands first."""
    waits: dict[tuple[int, int, int], list[float]] = {}
    labels: dict[tuple[int, int, int], str] = {}
    for run in runs:
        key = run.task.key
        waits.setdefault(key, []).append(run.wait)
        labels[key] = run.task.label
    return tuple(
        ClassStats(labels[key], len(w), percentile(w, 50), percentile(w, 99), max(w))
        for key, w in sorted(waits.items())
    )


NO_OWNER = "(none)"
"""How :func:`owner_stats` labels the tasks that name no owner."""


def owner_stats(runs: Sequence[TaskRun]) -> tuple[ClassStats, ...]:
    """Wait statistics per owner, by owner name, when ``runs`` have more than one owner;
    else empty (one owner's waits are the whole schedule's)."""
    waits: dict[str, list[float]] = {}
    for run in runs:
        owner = NO_OWNER if run.task.owner is None else run.task.owner
        waits.setdefault(owner, []).append(run.wait)
    if len(waits) < 2:
        return ()
    return tuple(
        ClassStats(owner, len(w), percentile(w, 50), percentile(w, 99), max(w))
        for owner, w in sorted(waits.items())
    )
