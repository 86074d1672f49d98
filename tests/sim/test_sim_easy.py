"""The ``hwpool`` (easy) policy in the simulator: issue 9's P1 trace, and a head
that a stream of small tasks never passes over."""

from __future__ import annotations

from hwpool._core._capacity import UNITS_PER_GPU, fraction_to_units
from hwpool._sim._simulate import simulate
from hwpool._sim._trace import Task


def frac(name: str, arrival: float, fraction: float, duration: float) -> Task:
    return Task(name, arrival, 1, fraction_to_units(fraction), duration)


# P1: 4 x 0.6 GPU for 100 s, then 4 whole-GPU tasks of 10 s, then 400 x 0.1 GPU of 1 s, all
# at t=0 in that order, on four GPUs.
P1 = (
    [frac(f"big{i}", 0, 0.6, 100) for i in range(4)]
    + [Task(f"whole{i}", 0, 1, UNITS_PER_GPU, 10) for i in range(4)]
    + [frac(f"small{i}", 0, 0.1, 1) for i in range(400)]
)


def starts(policy: str, prefix: str) -> list[float]:
    runs = simulate(P1, 4, policy).runs
    return [run.start for run in runs if run.task.name.startswith(prefix)]


def test_p1_easy_backfills_the_small_tasks_at_once() -> None:
    small = starts("hwpool", "small")
    # 12 slots of 0.1 on GPUs 1-3 (GPU 0 is the head's): 12 start at t=0, all within 34 s.
    assert sorted(small)[:12] == [0.0] * 12
    assert sorted(small)[12] == 1.0
    assert max(small) == 33.0


def test_p1_whole_gpu_tasks_start_when_the_big_tasks_end_under_both() -> None:
    for policy in ("hwpool-reserve-all", "hwpool"):
        assert starts(policy, "whole") == [100.0] * 4, policy


def test_p1_reserve_all_makes_the_small_tasks_wait() -> None:
    small = starts("hwpool-reserve-all", "small")
    assert min(small) >= 100.0
    easy, old = simulate(P1, 4, "hwpool"), simulate(P1, 4, "hwpool-reserve-all")
    assert easy.makespan < old.makespan


def test_head_is_not_passed_over_by_a_stream() -> None:
    # Two GPUs each 0.6 busy (GPU 0 until t=5, GPU 1 until t=1000); a whole GPU waits from
    # t=0.5 while 0.3-GPU tasks of 1 s arrive every 0.5 s until t=50.
    tasks = [
        frac("a", 0, 0.6, 5),
        frac("b", 0, 0.6, 1000),
        Task("head", 0.5, 1, UNITS_PER_GPU, 1),
    ] + [frac(f"s{i}", 1 + i / 2, 0.3, 1) for i in range(100)]
    runs = {run.task.name: run for run in simulate(tasks, 2, "hwpool").runs}
    assert (runs["head"].start, runs["head"].gpus) == (5.0, (0,))
    stream = [run for name, run in runs.items() if name.startswith("s")]
    assert all(run.gpus == (1,) for run in stream if run.start < 5.0)
    assert any(run.start < 5.0 for run in stream)


def test_head_reserves_a_gpu_that_can_hold_it_on_gpus_of_different_sizes() -> None:
    # 80 GiB and 24 GiB: a 60 GiB task leaves 20 GiB on GPU 0, less than GPU 1's 24 GiB, but a
    # 72 GiB head can only ever run on GPU 0: it reserves GPU 0, and the stream of 10 GiB
    # tasks backfills on GPU 1.
    gib = 1024
    tasks = [
        Task("a", 0, 1, 0, 5, memory_mib=60 * gib),
        Task("head", 0.5, 1, 0, 1, memory_mib=72 * gib),
    ] + [Task(f"s{i}", 1 + i / 2, 1, 0, 1, memory_mib=10 * gib) for i in range(40)]
    machine = [80 * gib, 24 * gib]
    runs = {run.task.name: run for run in simulate(tasks, 2, "hwpool", gpu_memory=machine).runs}
    head = runs["head"]
    assert (head.start, head.gpus) == (5.0, (0,))
    before = [run for name, run in runs.items() if name.startswith("s") and run.start < head.start]
    assert before and all(run.gpus == (1,) for run in before)
