"""Baseline GPU scheduling policies, for the simulator's ``--policy`` comparison only.

Each is a small decision rule over the same inputs as the hwpool policy (a task arrives with a
demand; a task finishes) and answers with the tasks it starts and their GPUs. None of them is
used by :class:`hwpool.GPUPool`; they exist to show what the hwpool core buys:

- ``fifo`` and ``first-fit`` are core policies (``hwpool._core._fifo``,
  ``hwpool._core._first_fit``), driven here through the core's
  :class:`~hwpool._core._scheduler.Scheduler` as the hwpool policies are
  (:class:`CorePolicy`): strict FIFO with best fit, and greedy first fit with no
  reservations (a multi-GPU task can starve behind a stream of small ones).
- ``shortest-queue``: each task joins, at arrival, the queue of the GPU(s) with the fewest
  unfinished tasks (ties: lowest index); each GPU serves its own queue in FIFO order.

On GPUs of different sizes (``simulate --gpu-memory``) each GPU starts with its own total free
and a task takes its units on one GPU, as in the core; a fraction (a relative demand) takes
that share of the GPU it runs on, rounded up as the core does; a whole-GPU task takes
completely free GPUs of any size (shortest-queue queues it on the least loaded).

Every event costs about the same however long the queues grow (no policy rescans its queue),
so a trace of n tasks is simulated in about n times the cost of one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping, Sequence

from .._core._capacity import UNITS_PER_GPU
from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._policies import BASELINES
from .._core._scheduler import Demand, Grant, Scheduler
from ._machine import held_on

__all__ = [
    "BaselineScheduler",
    "CorePolicy",
    "FifoPolicy",
    "FirstFitPolicy",
    "ShortestQueuePolicy",
    "Start",
]

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


class BaselineScheduler(Scheduler):
    """The core's face offering the simulator's baselines (``fifo``, ``first-fit``) instead of
    the policies a pool or server runs."""

    offered = BASELINES


class CorePolicy:
    """A policy of the scheduler core (``core_policy``, one of ``POLICIES`` or ``BASELINES``
    of ``hwpool._core._policies``), with tickets mapped to task indices. ``totals``: each
    GPU's units (None: ``num_gpus`` of ``units_per_gpu``); ``shares``, ``half_life`` and
    ``backfill`` as the core takes them. Virtual time is the core's ``now``, so ``easy``
    learns hold times as it would in real time."""

    def __init__(
        self,
        num_gpus: int,
        units_per_gpu: int = UNITS_PER_GPU,
        totals: Sequence[int] | None = None,
        core_policy: str = "easy",
        *,
        shares: Mapping[Hashable, float] | None = None,
        half_life: float = DEFAULT_HALF_LIFE,
        backfill: str = "limits",
    ) -> None:
        gpus: int | tuple[int, ...] = num_gpus if totals is None else tuple(totals)
        face = BaselineScheduler if core_policy in BASELINES else Scheduler
        self.core = face(
            gpus,
            units_per_gpu if totals is None else None,
            policy=core_policy,
            shares=shares,
            half_life=half_life,
            backfill=backfill,
        )
        self._task_of: dict[int, int] = {}
        self._held: dict[int, Grant] = {}

    @property
    def free(self) -> list[int]:
        """Free units per GPU."""
        return list(self.core.free)

    @property
    def waiting(self) -> int:
        """How many tasks wait."""
        return self.core.queue_length

    @property
    def held(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """Each running task's GPUs and the units it holds on each."""
        return {
            task: (grant.gpus, tuple(units for _, units in self.core.held(grant)))
            for task, grant in self._held.items()
        }

    @property
    def queue(self) -> list[tuple[int, Demand]]:
        """The waiting tasks with their demands, in the core's queue order."""
        return [(self._task_of[w.ticket], w.demand) for w in self.core.waiters()]

    def submit(self, task: int, demand: Demand, now: float = 0.0) -> list[Start]:
        """``task`` arrives wanting ``demand``; return the tasks started as a result."""
        ticket, grant = self.core.submit(demand, now=now)
        self._task_of[ticket] = task
        return self._started([] if grant is None else [grant])

    def finish(self, task: int, now: float = 0.0) -> list[Start]:
        """``task`` finished; return the tasks started as a result."""
        grant = self._held.pop(task)
        held = self.core.held(grant)
        return self._started(self.core.release_many(held, ticket=grant.ticket, now=now))

    def _started(self, grants: list[Grant]) -> list[Start]:
        started = []
        for grant in grants:
            task = self._task_of.pop(grant.ticket)
            self._held[task] = grant
            started.append((task, grant.gpus))
        return started


class FifoPolicy(CorePolicy):
    """Strict FIFO: start tasks from the head while the head fits; nothing overtakes it (the
    core's ``fifo``)."""

    def __init__(
        self, num_gpus: int, units_per_gpu: int, totals: Sequence[int] | None = None
    ) -> None:
        super().__init__(num_gpus, units_per_gpu, totals, "fifo")


class FirstFitPolicy(CorePolicy):
    """Greedy first fit: start every waiting task that fits, in queue order, no reservations
    (the core's ``first-fit``)."""

    def __init__(
        self, num_gpus: int, units_per_gpu: int, totals: Sequence[int] | None = None
    ) -> None:
        super().__init__(num_gpus, units_per_gpu, totals, "first-fit")

    @property
    def classes(self) -> set[Demand]:
        """The demands that wait (each waits in one FIFO of its own)."""
        return {waiter.demand for waiter in self.core.waiters()}


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
