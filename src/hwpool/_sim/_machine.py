"""The machine a simulation runs on: GPUs shared in fractions, or GPUs sized in memory.

On a machine sized in memory (``simulate --gpu-memory 80GiB,24GiB``) each GPU's capacity is its
memory in MiB, as in ``GPUPool(gpu_memory=...)``: a task's ``memory`` is that many units on one
GPU; a whole-GPU task takes completely free GPUs of any size; a fraction below 1 is that share
of the GPU it runs on, as in the pool (on GPUs of different sizes a relative demand of the
core: ``0.5`` holds 40 GiB on an 80 GiB GPU, 12 GiB on a 24 GiB one). Work is counted in
MiB-seconds against the machine's total memory (a whole GPU: its total), so utilisation and
the lower bound mean the same as on a fraction machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._core._capacity import UNITS_PER_GPU
from .._core._demand import make_demand
from .._core._memory import format_mib
from .._core._scheduler import Demand
from ._trace import Task

__all__ = ["held_on", "min_work", "run_work", "task_demand"]


def task_demand(task: Task, totals: Sequence[int] | None) -> Demand:
    """What ``task`` asks of the core on this machine (``totals`` None: fractions), with its
    owner, priority and time limit.

    Raises ValueError naming the task for a memory task on a fraction machine or an amount
    larger than every GPU.
    """
    if task.memory_mib is not None:
        if totals is None:
            raise ValueError(
                f"task {task.name!r} asks for memory ({format_mib(task.memory_mib)}): describe "
                "the GPUs' memory (--gpu-memory 80GiB,24GiB)"
            )
        if task.memory_mib > max(totals):
            raise ValueError(
                f"task {task.name!r} asks for {format_mib(task.memory_mib)}, more than the "
                f"largest GPU ({format_mib(max(totals))})"
            )
    return make_demand(
        count=task.count,
        units=None if task.memory_mib is not None else task.units,
        memory=task.memory_mib,
        totals=totals,
        owner=task.owner,
        priority=task.priority,
        limit=task.limit,
    )


def held_on(demand: Demand, total: int) -> int:
    """The units ``demand`` holds on one GPU of ``total`` units, as the core counts them:
    the total for whole GPUs, the share rounded up (at least 1) for a relative demand."""
    if demand.whole:
        return total
    if demand.relative:
        return max(1, -(-demand.units * total // UNITS_PER_GPU))
    return demand.units


def run_work(task: Task, gpus: Sequence[int], totals: Sequence[int]) -> float:
    """The MiB-seconds ``task`` held, run on ``gpus``."""
    demand = task_demand(task, totals)
    return sum(held_on(demand, totals[gpu]) for gpu in gpus) * task.runtime


def min_work(task: Task, totals: Sequence[int]) -> float:
    """The MiB-seconds ``task`` holds wherever it runs."""
    demand = task_demand(task, totals)
    if demand.whole or demand.relative:  # at the least, on the smallest GPUs
        smallest = sorted(totals)[: demand.count]
        return sum(held_on(demand, total) for total in smallest) * task.runtime
    return demand.units * demand.count * task.runtime
