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

On GPUs of different sizes (``simulate --gpu-memory``) each GPU starts with its own total free
and a task takes its units on one GPU, as in the core; a fraction (a relative demand) takes
that share of the GPU it runs on, rounded up as the core does (fifo's best fit weighs that
need per GPU, as the core's does); a whole-GPU task takes completely free GPUs of any size
(fifo and first-fit take the lowest-indexed ones, shortest-queue queues it on the least
loaded).

Every event costs about the same however long the queues grow (no policy rescans its queue),
so a trace of n tasks is simulated in about n times the cost of one: first-fit keeps one FIFO
per demand class, and only looks at the head of each class.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

from .._core._scheduler import Demand
from ._machine import held_on

__all__ = ["FifoPolicy", "FirstFitPolicy", "ShortestQueuePolicy", "Start"]

Start = tuple[int, tuple[int, ...]]
"""A task that starts now, and the GPUs it runs on."""


class _Baseline:
    """Free capacity per GPU and what each running task holds.

    ``totals``: each GPU's capacity where they differ (else ``units_per_gpu`` each).
    """

    def __init__(
        self, num_gpus: int, units_per_gpu: int, totals: Sequence[int] | None = None
    ) -> None:
        self.units_per_gpu = units_per_gpu
        self.totals = list(totals) if totals is not None else [units_per_gpu] * num_gpus
        self.free = list(self.totals)
        self.held: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # gpus, units each

    def submit(self, task: int, demand: Demand, now: float = 0.0) -> list[Start]:
        """``task`` arrives wanting ``demand``; return the tasks started as a result."""
        self.enqueue(task, demand)
        return self.dispatch()

    def finish(self, task: int, now: float = 0.0) -> list[Start]:
        """``task`` finished; free what it held and return the tasks started as a result."""
        gpus, units = self.held.pop(task)
        for gpu, taken in zip(gpus, units, strict=True):
            self.free[gpu] += taken
        return self.dispatch()

    def enqueue(self, task: int, demand: Demand) -> None:
        raise NotImplementedError

    def dispatch(self) -> list[Start]:
        raise NotImplementedError

    def start(self, task: int, gpus: tuple[int, ...], demand: Demand) -> Start:
        """Start ``task`` on ``gpus``, each holding what ``demand`` needs there."""
        units = tuple(self.need(demand, gpu) for gpu in gpus)
        for gpu, taken in zip(gpus, units, strict=True):
            self.free[gpu] -= taken
        self.held[task] = (gpus, units)
        return task, gpus

    def need(self, demand: Demand, gpu: int) -> int:
        """The units ``demand`` takes on ``gpu``: its total for whole GPUs of different
        sizes, its share of it for a relative demand, else ``demand.units``."""
        return held_on(demand, self.totals[gpu])

    def fits(self, gpu: int, demand: Demand) -> bool:
        """Whether ``gpu`` has what ``demand`` needs there free."""
        return self.free[gpu] >= self.need(demand, gpu)

    def fitting(self, demand: Demand) -> list[int]:
        """The GPUs with what ``demand`` needs there free, lowest index first."""
        if demand.whole or demand.relative:
            return [gpu for gpu in range(len(self.free)) if self.fits(gpu, demand)]
        units = demand.units
        return [gpu for gpu, free in enumerate(self.free) if free >= units]


class FifoPolicy(_Baseline):
    """Strict FIFO: start tasks from the head while the head fits; nothing overtakes it."""

    def __init__(
        self, num_gpus: int, units_per_gpu: int, totals: Sequence[int] | None = None
    ) -> None:
        super().__init__(num_gpus, units_per_gpu, totals)
        self.queue: deque[tuple[int, Demand]] = deque()

    def enqueue(self, task: int, demand: Demand) -> None:
        self.queue.append((task, demand))

    def dispatch(self) -> list[Start]:
        started = []
        while self.queue:
            task, demand = self.queue[0]
            fitting = self.fitting(demand)
            if len(fitting) < demand.count:
                break
            if demand.count == 1 and not demand.whole:  # best fit, least left, as in the core
                left = {g: self.free[g] - self.need(demand, g) for g in fitting}
                gpus: tuple[int, ...] = (min(fitting, key=lambda g: (left[g], g)),)
            else:
                gpus = tuple(fitting[: demand.count])
            self.queue.popleft()
            started.append(self.start(task, gpus, demand))
        return started


class FirstFitPolicy(_Baseline):
    """Greedy first fit: start every waiting task that fits, in queue order, no reservations.

    Walking the whole queue on every event made a growing queue quadratic. The same schedule
    comes from repeatedly starting the earliest waiting task that fits, until none does: free
    capacity only shrinks during one walk, so a task that did not fit when the walk reached it
    cannot fit later in that walk. Tasks of one demand class fit or not together, and the
    earliest of a class is the head of its FIFO, so each step looks at one task per class.
    """

    def __init__(
        self, num_gpus: int, units_per_gpu: int, totals: Sequence[int] | None = None
    ) -> None:
        super().__init__(num_gpus, units_per_gpu, totals)
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
            gpus = tuple(self.fitting(demand)[: demand.count])
            started.append(self.start(task, gpus, demand))
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
            if demand.whole or demand.relative:
                fits = len(self.fitting(demand)) >= demand.count
            else:
                fits = demand.count <= len(ranked) and ranked[demand.count - 1] >= demand.units
            if fits:
                best, best_order = demand, order
        return best


class ShortestQueuePolicy(_Baseline):
    """Join the shortest queue: placement at arrival, then per-GPU FIFO service.

    An event can only unblock the lanes it touched (those of the task that arrived, finished
    or started), so only their heads are looked at.
    """

    def __init__(
        self, num_gpus: int, units_per_gpu: int, totals: Sequence[int] | None = None
    ) -> None:
        super().__init__(num_gpus, units_per_gpu, totals)
        self.lanes: list[deque[int]] = [deque() for _ in range(num_gpus)]  # waiting, per GPU
        self.load = [0] * num_gpus  # unfinished (waiting or running) tasks per GPU
        self.assigned: dict[int, tuple[tuple[int, ...], Demand]] = {}  # waiting: gpus, demand
        self._touched: set[int] = set()

    def enqueue(self, task: int, demand: Demand) -> None:
        able = [g for g in range(len(self.load)) if self.totals[g] >= self.need(demand, g)]
        by_load = sorted(able, key=lambda g: (self.load[g], g))  # GPUs it can ever fit on
        gpus = tuple(sorted(by_load[: demand.count]))
        self.assigned[task] = (gpus, demand)
        for gpu in gpus:
            self.lanes[gpu].append(task)
            self.load[gpu] += 1
        self._touched.update(gpus)

    def finish(self, task: int, now: float = 0.0) -> list[Start]:
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
                gpus, demand = self.assigned.pop(task)
                for gpu in gpus:
                    self.lanes[gpu].popleft()
                started.append(self.start(task, gpus, demand))
                self._touched.update(gpus)
        return started

    def _startable(self, task: int) -> bool:
        gpus, demand = self.assigned[task]
        return all(self.lanes[g][0] == task and self.fits(g, demand) for g in gpus)
