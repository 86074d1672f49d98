"""The linear baselines give exactly the schedules of the old rescanning ones.

The reference policies below are the previous implementations (each event rescanned the whole
queue, so a growing queue made first-fit quadratic); the new ones must decide the same starts
at the same instants on the same GPUs, for every seeded workload.
"""

from __future__ import annotations

import heapq
import random

import pytest

from hwpool._core._scheduler import Demand
from hwpool._sim._baselines import FifoPolicy, FirstFitPolicy, ShortestQueuePolicy, Start

WHOLE = 100
Workload = list[tuple[float, Demand, float]]


class _OldBaseline:
    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        self.free = [units_per_gpu] * num_gpus
        self.queue: dict[int, Demand] = {}
        self.held: dict[int, tuple[tuple[int, ...], int]] = {}

    def submit(self, task: int, demand: Demand) -> list[Start]:
        self.queue[task] = demand
        return self.dispatch()

    def finish(self, task: int) -> list[Start]:
        gpus, units = self.held.pop(task)
        for gpu in gpus:
            self.free[gpu] += units
        return self.dispatch()

    def dispatch(self) -> list[Start]:
        raise NotImplementedError

    def start(self, task: int, gpus: tuple[int, ...]) -> Start:
        demand = self.queue.pop(task)
        for gpu in gpus:
            self.free[gpu] -= demand.units
        self.held[task] = (gpus, demand.units)
        return task, gpus

    def fitting(self, demand: Demand) -> list[int]:
        return [gpu for gpu in range(len(self.free)) if self.free[gpu] >= demand.units]


class OldFifo(_OldBaseline):
    def dispatch(self) -> list[Start]:
        started = []
        while self.queue:
            task, demand = next(iter(self.queue.items()))
            fitting = self.fitting(demand)
            if len(fitting) < demand.count:
                break
            if demand.count == 1:
                gpus: tuple[int, ...] = (min(fitting, key=lambda g: (self.free[g], g)),)
            else:
                gpus = tuple(fitting[: demand.count])
            started.append(self.start(task, gpus))
        return started


class OldFirstFit(_OldBaseline):
    def dispatch(self) -> list[Start]:
        started = []
        for task, demand in list(self.queue.items()):
            fitting = self.fitting(demand)
            if len(fitting) >= demand.count:
                started.append(self.start(task, tuple(fitting[: demand.count])))
        return started


class OldShortestQueue(_OldBaseline):
    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        super().__init__(num_gpus, units_per_gpu)
        self.lanes: list[list[int]] = [[] for _ in range(num_gpus)]
        self.load = [0] * num_gpus
        self.assigned: dict[int, tuple[int, ...]] = {}

    def submit(self, task: int, demand: Demand) -> list[Start]:
        by_load = sorted(range(len(self.load)), key=lambda g: (self.load[g], g))
        gpus = sorted(by_load[: demand.count])
        self.assigned[task] = tuple(gpus)
        for gpu in gpus:
            self.lanes[gpu].append(task)
            self.load[gpu] += 1
        return super().submit(task, demand)

    def finish(self, task: int) -> list[Start]:
        for gpu in self.held[task][0]:
            self.load[gpu] -= 1
        return super().finish(task)

    def dispatch(self) -> list[Start]:
        started: list[Start] = []
        progress = True
        while progress:
            progress = False
            for lane in self.lanes:
                if lane and self._startable(lane[0]):
                    task = lane[0]
                    gpus = self.assigned.pop(task)
                    for gpu in gpus:
                        self.lanes[gpu].pop(0)
                    started.append(self.start(task, gpus))
                    progress = True
        return started

    def _startable(self, task: int) -> bool:
        gpus = self.assigned[task]
        units = self.queue[task].units
        return all(self.lanes[g][0] == task and self.free[g] >= units for g in gpus)


def workload(seed: int, num_gpus: int) -> Workload:
    """A seeded overloaded workload of mixed fractions and multi-GPU jobs, with ties."""
    rng = random.Random(seed)
    sizes = [(1, rng.choice((10, 25, 30, 50, 70, 100))) for _ in range(rng.randint(1, 4))]
    if num_gpus > 1:
        sizes += [(rng.randint(2, num_gpus), WHOLE) for _ in range(rng.randint(0, 2))]
    tasks, t = [], 0.0
    for _ in range(rng.randint(20, 300)):
        t += rng.choice((0.0, 0.0, 0.1, 0.5, 1.0))  # many arrivals at one instant
        count, units = rng.choice(sizes)
        tasks.append((t, Demand(count, units), float(rng.randint(1, 8))))
    return tasks


def replay(policy: object, tasks: Workload) -> dict[int, tuple[float, tuple[int, ...]]]:
    """When and where each task started: the simulator's event loop, on bare policies."""
    events = [(arrival, 1, i) for i, (arrival, _, _) in enumerate(tasks)]
    heapq.heapify(events)
    started: dict[int, tuple[float, tuple[int, ...]]] = {}
    while events:
        now, kind, index = heapq.heappop(events)
        got = policy.submit(index, tasks[index][1]) if kind else policy.finish(index)  # type: ignore[attr-defined]
        for task, gpus in got:
            started[task] = (now, gpus)
            heapq.heappush(events, (now + tasks[task][2], 0, task))
    assert len(started) == len(tasks)
    return started


PAIRS = [
    (FifoPolicy, OldFifo),
    (FirstFitPolicy, OldFirstFit),
    (ShortestQueuePolicy, OldShortestQueue),
]


@pytest.mark.parametrize(("new", "old"), PAIRS, ids=["fifo", "first-fit", "shortest-queue"])
@pytest.mark.parametrize("seed", range(40))
def test_same_schedule_as_the_rescanning_policy(new: type, old: type, seed: int) -> None:
    num_gpus = 1 + seed % 6
    tasks = workload(seed, num_gpus)
    assert replay(new(num_gpus, WHOLE), tasks) == replay(old(num_gpus, WHOLE), tasks)


def test_first_fit_looks_at_one_task_per_demand_class() -> None:
    """A release with 1,000 tasks of one class waiting checks one head, not 1,000 tasks."""
    greedy = FirstFitPolicy(1, WHOLE)
    greedy.submit(0, Demand(1, WHOLE))
    for task in range(1, 1001):
        greedy.submit(task, Demand(1, 60))
    greedy.submit(1001, Demand(1, 30))
    assert len(greedy.classes) == 2 and greedy.waiting == 1001
    assert greedy.finish(0) == [(1, (0,)), (1001, (0,))]  # 60 fits, then 30 beside it
