"""Property tests of the simulator's baselines, FIFO and first-fit (issue 37).

A hypothesis state machine submits and finishes tasks at random on GPUs of one size or of
several, and after every step checks the books (per GPU, free plus what running tasks hold
is its total, never below zero), that each task is exactly one of waiting, running or
finished, that a start is what its demand asks, and each policy's own rule, replayed on the
capacity as it was before the step: FIFO starts tasks from the head only, in order, on the
best-fitting GPU (a fraction) or the lowest-indexed free ones (whole GPUs), and stops at
the first that does not fit; first-fit starts, one at a time, the earliest waiting task that
fits, on the lowest-indexed GPUs that fit, until none does.

``TESTS_HWPOOL_LONG=1`` runs many more examples (see docs/environment.md).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from hwpool._sim._baselines import FifoPolicy, FirstFitPolicy, Start

U = 1_000
LONG = bool(os.environ.get("TESTS_HWPOOL_LONG"))
# A long run takes minutes per machine: past the suite's timeout of a minute a test.
pytestmark = [pytest.mark.timeout(3000)] if LONG else []
SHAPES: list[list[int] | None] = [None, [U, U, U // 2, U // 4], [U // 2, U, U // 4, U]]


def need(demand: Demand, total: int) -> int:
    """Units ``demand`` takes on a GPU of ``total`` units (the core's rule 1)."""
    if demand.whole:
        return total
    if demand.relative:
        return max(1, -(-demand.units * total // UNITS_PER_GPU))
    return demand.units


class BaselineMachine(RuleBasedStateMachine):
    POLICY: ClassVar[type[FifoPolicy] | type[FirstFitPolicy]] = FifoPolicy

    def __init__(self) -> None:
        super().__init__()
        self.policy: Any = None
        self.next_task = 1
        self.waiting: dict[int, Demand] = {}  # in arrival order
        self.running: dict[int, Demand] = {}
        self.finished: set[int] = set()

    @initialize(shape=st.sampled_from(range(len(SHAPES))))
    def build(self, shape: int) -> None:
        totals = SHAPES[shape]
        self.policy = self.POLICY(4, U, totals)
        self.totals = list(totals) if totals is not None else [U] * 4

    @rule(
        kind=st.sampled_from(["fraction", "relative", "whole"]),
        units=st.sampled_from([1, 200, 250, 400, 700]),
        share=st.sampled_from([UNITS_PER_GPU // 4, UNITS_PER_GPU // 2, UNITS_PER_GPU]),
        count=st.integers(1, 3),
    )
    def submit(self, kind: str, units: int, share: int, count: int) -> None:
        if kind == "whole":
            demand = Demand(count, U, whole=True)
        elif kind == "relative":
            demand = Demand(1, share, relative=True)
        else:
            demand = Demand(1, min(units, max(self.totals)))
        task = self.next_task
        self.next_task += 1
        self.waiting[task] = demand
        free = list(self.policy.free)
        self.absorb(self.policy.submit(task, demand), free)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        task = data.draw(st.sampled_from(sorted(self.running)))
        gpus, units = self.policy.held[task]
        free = list(self.policy.free)
        for gpu, taken in zip(gpus, units, strict=True):
            free[gpu] += taken
        del self.running[task]
        self.finished.add(task)
        self.absorb(self.policy.finish(task), free)

    # ------------------------------------------------------------- checks
    def fitting(self, demand: Demand, free: list[int]) -> list[int]:
        return [g for g, f in enumerate(free) if f >= need(demand, self.totals[g])]

    def absorb(self, starts: list[Start], free: list[int]) -> None:
        """Take ``starts``, checking each against the policy's rule replayed on ``free``
        (the capacity after the step's own release, before any start)."""
        for task, gpus in starts:
            assert task in self.waiting, f"task {task} started but not waiting"
            demand = self.waiting[task]
            assert len(gpus) == demand.count == len(set(gpus)), (task, gpus, demand)
            fitting = self.fitting(demand, free)
            assert set(gpus) <= set(fitting), f"{task} started on {gpus}, not free: {free}"
            self.check_choice(task, demand, gpus, free)
            for gpu in gpus:
                free[gpu] -= need(demand, self.totals[gpu])
            del self.waiting[task]
            self.running[task] = demand
            assert self.policy.held[task] == (
                gpus,
                tuple(need(demand, self.totals[g]) for g in gpus),
            )
        assert free == list(self.policy.free), "the replayed capacity differs"
        self.check_stopped(free)

    def check_choice(
        self, task: int, demand: Demand, gpus: tuple[int, ...], free: list[int]
    ) -> None:
        raise NotImplementedError

    def check_stopped(self, free: list[int]) -> None:
        raise NotImplementedError

    @invariant()
    def books_add_up(self) -> None:
        if self.policy is None:
            return
        held = [0] * len(self.totals)
        for task in self.running:
            gpus, units = self.policy.held[task]
            for gpu, taken in zip(gpus, units, strict=True):
                held[gpu] += taken
        for gpu, total in enumerate(self.totals):
            assert 0 <= self.policy.free[gpu] <= total
            assert self.policy.free[gpu] + held[gpu] == total, (gpu, self.policy.free, held)

    @invariant()
    def every_task_in_one_place(self) -> None:
        if self.policy is None:
            return
        waiting, running = set(self.waiting), set(self.running)
        assert not waiting & running and not (waiting | running) & self.finished
        assert waiting | running | self.finished == set(range(1, self.next_task))
        assert set(self.policy.held) == running
        assert self.policy_waiting() == list(self.waiting)

    def policy_waiting(self) -> list[int]:
        raise NotImplementedError


class FifoMachine(BaselineMachine):
    POLICY = FifoPolicy

    def check_choice(
        self, task: int, demand: Demand, gpus: tuple[int, ...], free: list[int]
    ) -> None:
        """Only the head starts; a fraction on the GPU with the least left, ties to the
        lowest index; whole GPUs on the lowest-indexed free ones."""
        assert task == next(iter(self.waiting)), f"task {task} overtook the head"
        fitting = self.fitting(demand, free)
        if demand.count == 1 and not demand.whole:
            best = min(fitting, key=lambda g: (free[g] - need(demand, self.totals[g]), g))
            assert gpus == (best,), (gpus, best, free)
        else:
            assert gpus == tuple(fitting[: demand.count]), (gpus, fitting)

    def check_stopped(self, free: list[int]) -> None:
        """The head, if any, does not fit (nothing overtakes it)."""
        if self.waiting:
            task, demand = next(iter(self.waiting.items()))
            assert len(self.fitting(demand, free)) < demand.count, f"head {task} fits"

    def policy_waiting(self) -> list[int]:
        return [task for task, _ in self.policy.queue]


class FirstFitMachine(BaselineMachine):
    POLICY = FirstFitPolicy

    def check_choice(
        self, task: int, demand: Demand, gpus: tuple[int, ...], free: list[int]
    ) -> None:
        """The earliest waiting task that fits, on the lowest-indexed GPUs that fit."""
        for earlier, other in self.waiting.items():
            if earlier == task:
                break
            assert len(self.fitting(other, free)) < other.count, f"{earlier} fits, {task} ran"
        assert gpus == tuple(self.fitting(demand, free)[: demand.count]), (gpus, free)

    def check_stopped(self, free: list[int]) -> None:
        """No waiting task fits."""
        for task, demand in self.waiting.items():
            assert len(self.fitting(demand, free)) < demand.count, f"task {task} fits"

    def policy_waiting(self) -> list[int]:
        assert self.policy.waiting == len(self.waiting)
        return [task for task, _ in self.policy.queue]


SETTINGS = settings(
    max_examples=500 if LONG else 60,
    stateful_step_count=60 if LONG else 40,
    deadline=None,
    derandomize=not LONG,
    suppress_health_check=[HealthCheck.too_slow],
)
FifoMachine.TestCase.settings = SETTINGS
FirstFitMachine.TestCase.settings = SETTINGS
TestFifo = FifoMachine.TestCase
TestFirstFit = FirstFitMachine.TestCase
