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
"""

from __future__ import annotations

from .._core._scheduler import Demand

__all__ = ["FifoPolicy", "FirstFitPolicy", "ShortestQueuePolicy", "Start"]

Start = tuple[int, tuple[int, ...]]
"""A task that starts now, and the GPUs it runs on."""


class _Baseline:
    """Free capacity per GPU, a queue of waiting tasks and what each running task holds."""

    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        self.units_per_gpu = units_per_gpu
        self.free = [units_per_gpu] * num_gpus
        self.queue: dict[int, Demand] = {}
        self.held: dict[int, tuple[tuple[int, ...], int]] = {}

    def submit(self, task: int, demand: Demand) -> list[Start]:
        """``task`` arrives wanting ``demand``; return the tasks started as a result."""
        self.queue[task] = demand
        return self.dispatch()

    def finish(self, task: int) -> list[Start]:
        """``task`` finished; free what it held and return the tasks started as a result."""
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

    def fitting(self, demand: Demand, candidates: list[int]) -> list[int]:
        return [gpu for gpu in candidates if self.free[gpu] >= demand.units]


class FifoPolicy(_Baseline):
    """Strict FIFO: start tasks from the head while the head fits; nothing overtakes it."""

    def dispatch(self) -> list[Start]:
        started = []
        while self.queue:
            task, demand = next(iter(self.queue.items()))
            fitting = self.fitting(demand, list(range(len(self.free))))
            if len(fitting) < demand.count:
                break
            if demand.count == 1:  # best fit, as in the hwpool core
                gpus: tuple[int, ...] = (min(fitting, key=lambda g: (self.free[g], g)),)
            else:
                gpus = tuple(fitting[: demand.count])
            started.append(self.start(task, gpus))
        return started


class FirstFitPolicy(_Baseline):
    """Greedy first fit: start every waiting task that fits, in queue order, no reservations."""

    def dispatch(self) -> list[Start]:
        started = []
        everything = list(range(len(self.free)))
        for task, demand in list(self.queue.items()):
            fitting = self.fitting(demand, everything)
            if len(fitting) >= demand.count:
                started.append(self.start(task, tuple(fitting[: demand.count])))
        return started


class ShortestQueuePolicy(_Baseline):
    """Join the shortest queue: placement at arrival, then per-GPU FIFO service."""

    def __init__(self, num_gpus: int, units_per_gpu: int) -> None:
        super().__init__(num_gpus, units_per_gpu)
        self.lanes: list[list[int]] = [[] for _ in range(num_gpus)]  # waiting tasks per GPU
        self.load = [0] * num_gpus  # unfinished (waiting or running) tasks per GPU
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
        """Start lane heads that fit; a multi-GPU task must head all its lanes at once."""
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
