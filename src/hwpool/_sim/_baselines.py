"""Baseline GPU scheduling policies, for the simulator's ``--policy`` comparison only.

Each is a small decision rule over the same inputs as the hwpool policy (a task arrives with a
demand; a task finishes) and answers with the tasks it starts and their GPUs. None of them is
used by :class:`hwpool.GPUPool`; they exist to show what the hwpool core buys:

- ``fifo``: strict FIFO; nothing overtakes the head of the queue (best-fit placement).
- ``first-fit``: greedy; on every event, walk the queue and start whatever fits, on the
  lowest-indexed GPUs that fit, with no reservations. A multi-GPU task can starve behind a
  stream of small ones.
- ``shortest-queue``: each task joins, at arrival, the queue of the GPU(s) with the fewest
  unfinished tasks (ties: lowest index); each GPU serves its own queue in FIFO order.

Every event costs about the same however long the queues grow (no policy rescans its queue),
so a trace of n tasks is simulated in about n times the cost of one: first-fit keeps one FIFO
per demand class, and only looks at the head of each class.
"""

from __future__ import annotations

import itertools
from collections import deque

from .._core._scheduler import Demand

__all__ = ["FifoPolicy", "FirstFitPolicy", "ShortestQueuePolicy", "Start"]

Start = tuple[int, tuple[int, ...]]
"""A task that starts now, and the GPUs it runs on."""


class _Baseline:
    """Free capacity per GPU and what each running task holds."""

    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        self.units_per_gpu = units_per_gpu
        self.free = [units_per_gpu] * num_gpus
        self.held: dict[int, tuple[tuple[int, ...], int]] = {}

    def submit(self, task: int, demand: Demand) -> list[Start]:
        """``task`` arrives wanting ``demand``; return the tasks started as a result."""
        self.enqueue(task, demand)
        return self.dispatch()

    def finish(self, task: int) -> list[Start]:
        """``task`` finished; free what it held and return the tasks started as a result."""
        gpus, units = self.held.pop(task)
        for gpu in gpus:
            self.free[gpu] += units
        return self.dispatch()

    def enqueue(self, task: int, demand: Demand) -> None:
        raise NotImplementedError

    def dispatch(self) -> list[Start]:
        raise NotImplementedError

    def start(self, task: int, gpus: tuple[int, ...], units: int) -> Start:
        for gpu in gpus:
            self.free[gpu] -= units
        self.held[task] = (gpus, units)
        return task, gpus

    def fitting(self, units: int) -> list[int]:
        """The GPUs with at least ``units`` free, lowest index first."""
        return [gpu for gpu, free in enumerate(self.free) if free >= units]


class FifoPolicy(_Baseline):
    """Strict FIFO: start tasks from the head while the head fits; nothing overtakes it."""

    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        super().__init__(num_gpus, units_per_gpu)
        self.queue: deque[tuple[int, Demand]] = deque()

    def enqueue(self, task: int, demand: Demand) -> None:
        self.queue.append((task, demand))

    def dispatch(self) -> list[Start]:
        started = []
        while self.queue:
            task, demand = self.queue[0]
            fitting = self.fitting(demand.units)
            if len(fitting) < demand.count:
                break
            if demand.count == 1:  # best fit, as in the hwpool core
                gpus: tuple[int, ...] = (min(fitting, key=lambda g: (self.free[g], g)),)
            else:
                gpus = tuple(fitting[: demand.count])
            self.queue.popleft()
            started.append(self.start(task, gpus, demand.units))
        return started


class FirstFitPolicy(_Baseline):
    """Greedy first fit: start every waiting task that fits, in queue order, no reservations.

    Walking the whole queue on every event made a growing queue quadratic. The same schedule
    comes from repeatedly starting the earliest waiting task that fits, until none does: free
    capacity only shrinks during one walk, so a task that did not fit when the walk reached it
    cannot fit later in that walk. Tasks of one demand class fit or not together, and the
    earliest of a class is the head of its FIFO, so each step looks at one task per class.
    """

    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        super().__init__(num_gpus, units_per_gpu)
        self.classes: dict[Demand, deque[tuple[int, int]]] = {}  # demand -> (order, task)
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        """How many tasks wait."""
        return sum(len(fifo) for fifo in self.classes.values())

    def enqueue(self, task: int, demand: Demand) -> None:
        self.classes.setdefault(demand, deque()).append((next(self._order), task))

    def dispatch(self) -> list[Start]:
        started = []
        while (demand := self._earliest_fitting()) is not None:
            fifo = self.classes[demand]
            _, task = fifo.popleft()
            if not fifo:
                del self.classes[demand]
            gpus = tuple(self.fitting(demand.units)[: demand.count])
            started.append(self.start(task, gpus, demand.units))
        return started

    def _earliest_fitting(self) -> Demand | None:
        """The class whose head came first among the classes that fit now, if any."""
        best: Demand | None = None
        best_order = -1
        ranked: list[int] = []  # free units, most first: ranked[c - 1] is the c-th most free
        for demand, fifo in self.classes.items():
            order = fifo[0][0]
            if best is not None and order > best_order:
                continue
            if not ranked:
                ranked = sorted(self.free, reverse=True)
            if demand.count <= len(ranked) and ranked[demand.count - 1] >= demand.units:
                best, best_order = demand, order
        return best


class ShortestQueuePolicy(_Baseline):
    """Join the shortest queue: placement at arrival, then per-GPU FIFO service.

    An event can only unblock the lanes it touched (those of the task that arrived, finished
    or started), so only their heads are looked at.
    """

    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        super().__init__(num_gpus, units_per_gpu)
        self.lanes: list[deque[int]] = [deque() for _ in range(num_gpus)]  # waiting, per GPU
        self.load = [0] * num_gpus  # unfinished (waiting or running) tasks per GPU
        self.assigned: dict[int, tuple[tuple[int, ...], int]] = {}  # waiting: (gpus, units)
        self._touched: set[int] = set()

    def enqueue(self, task: int, demand: Demand) -> None:
        by_load = sorted(range(len(self.load)), key=lambda g: (self.load[g], g))
        gpus = tuple(sorted(by_load[: demand.count]))
        self.assigned[task] = (gpus, demand.units)
        for gpu in gpus:
            self.lanes[gpu].append(task)
            self.load[gpu] += 1
        self._touched.update(gpus)

    def finish(self, task: int) -> list[Start]:
        gpus = self.held[task][0]
        for gpu in gpus:
            self.load[gpu] -= 1
        self._touched.update(gpus)
        return super().finish(task)

    def dispatch(self) -> list[Start]:
        """Start lane heads that fit; a multi-GPU task must head all its lanes at once."""
        started: list[Start] = []
        while self._touched:
            lane = self.lanes[self._touched.pop()]
            if lane and self._startable(lane[0]):
                task = lane[0]
                gpus, units = self.assigned.pop(task)
                for gpu in gpus:
                    self.lanes[gpu].popleft()
                started.append(self.start(task, gpus, units))
                self._touched.update(gpus)
        return started

    def _startable(self, task: int) -> bool:
        gpus, units = self.assigned[task]
        return all(self.lanes[g][0] == task and self.free[g] >= units for g in gpus)
