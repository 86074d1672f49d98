"""The virtual-time simulator: hand-worked schedules, starvation, invariants, figures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwpool._core._capacity import UNITS_PER_GPU, fraction_to_units
from hwpool._sim._simulate import (
    POLICIES,
    Outcome,
    lower_bound,
    packing_bound,
    percentile,
    simulate,
)
from hwpool._sim._trace import Task, load_trace


def task(name: str, arrival: float, demand: float, duration: float) -> Task:
    if demand >= 2:
        return Task(name, arrival, int(demand), UNITS_PER_GPU, duration)
    return Task(name, arrival, 1, fraction_to_units(demand), duration)


# Three GPUs. x, y, z fill them partly; w (2 GPUs) must wait; s (0.3) arrives behind w.
BACKFILL = [
    task("x", 0, 0.7, 4),
    task("y", 0, 0.6, 3),
    task("z", 0, 0.6, 2),
    task("w", 1, 2, 1),
    task("s", 1.5, 0.3, 1),
]

# Worked out by hand, (start, gpus) per task:
# hwpool: best fit puts x, y, z on GPUs 0, 1, 2 (free 0.3, 0.4, 0.4). w waits and reserves the
#   two most-free GPUs, 1 and 2. s fits on unreserved GPU 0 at once (backfill). z ends at 2:
#   GPU 2 is whole but GPU 1 is not; y ends at 3: w starts on 1, 2.
# fifo: same until s, which waits behind w; w starts at 3 on 1, 2, then s on GPU 0 (best fit).
# first-fit: s goes on the first GPU that fits (0) at once; w starts at 3 as above.
# shortest-queue: loads 1, 1, 1 when w arrives: w joins GPUs 0 and 1; s joins GPU 2 (load 1)
#   and fits there at once. w needs GPU 0 whole: x ends at 4.
# hwpool: as hwpool-reserve-all (w is the head and the only waiter, so it reserves the same GPUs).
# hwpool-limits: as hwpool (s backfills on GPU 0, which w does not reserve).
HAND_WORKED = {
    "hwpool-reserve-all": {
        "x": (0, (0,)),
        "y": (0, (1,)),
        "z": (0, (2,)),
        "w": (3, (1, 2)),
        "s": (1.5, (0,)),
    },
    "hwpool": {
        "x": (0, (0,)),
        "y": (0, (1,)),
        "z": (0, (2,)),
        "w": (3, (1, 2)),
        "s": (1.5, (0,)),
    },
    "hwpool-limits": {
        "x": (0, (0,)),
        "y": (0, (1,)),
        "z": (0, (2,)),
        "w": (3, (1, 2)),
        "s": (1.5, (0,)),
    },
    "fifo": {"x": (0, (0,)), "y": (0, (1,)), "z": (0, (2,)), "w": (3, (1, 2)), "s": (3, (0,))},
    "first-fit": {
        "x": (0, (0,)),
        "y": (0, (1,)),
        "z": (0, (2,)),
        "w": (3, (1, 2)),
        "s": (1.5, (0,)),
    },
    "shortest-queue": {
        "x": (0, (0,)),
        "y": (0, (1,)),
        "z": (0, (2,)),
        "w": (4, (0, 1)),
        "s": (1.5, (2,)),
    },
}


def schedule(result: Outcome) -> dict[str, tuple[float, tuple[int, ...]]]:
    return {run.task.name: (run.start, run.gpus) for run in result.runs}


@pytest.mark.parametrize("policy", POLICIES)
def test_hand_worked_backfill_schedule(policy: str) -> None:
    assert schedule(simulate(BACKFILL, 3, policy)) == HAND_WORKED[policy]


def test_hand_worked_figures() -> None:
    hw = simulate(BACKFILL, 3, "hwpool-reserve-all")
    assert hw.makespan == 4.0
    # work: 2.8 + 1.8 + 1.2 + 2 + 0.3 = 8.1 GPU-s; from t=0 over 3 GPUs: 2.7 s; x alone: 4 s.
    assert hw.lower_bound == 4.0
    assert hw.utilization == pytest.approx(8.1 / 12)
    waits = {s.label: (s.count, s.worst) for s in hw.classes}
    assert waits == {
        "0.3 GPU": (1, 0.0),
        "0.6 GPU": (2, 0.0),
        "0.7 GPU": (1, 0.0),
        "2 GPUs": (1, 2.0),
    }
    assert simulate(BACKFILL, 3, "shortest-queue").makespan == 5.0


# Two GPUs. p and q (half a GPU each) both fit on GPU 0 by best fit; the whole GPU r on GPU 1.
# r ends at 1, q at 2, p at 3; big (2 GPUs, arriving at 0.5) must wait for p.
WHOLE = [
    task("p", 0, 0.5, 3),
    task("q", 0, 0.5, 2),
    task("r", 0, 1, 1),
    task("big", 0.5, 2, 1),
    task("t", 1.5, 1, 1),
]


def test_hand_worked_whole_gpus() -> None:
    # hwpool: big reserves GPUs 1 and 0 at 0.5; at 1 GPU 1 is whole but reserved, so t (1.5)
    # waits behind big; p ends at 3: big runs 3-4, then t at 4 on GPU 0 (tie: lowest index).
    assert schedule(simulate(WHOLE, 2, "hwpool-reserve-all")) == {
        "p": (0, (0,)),
        "q": (0, (0,)),
        "r": (0, (1,)),
        "big": (3, (0, 1)),
        "t": (4, (0,)),
    }
    # first-fit: t takes the free GPU 1 at 1.5 (until 2.5); big still starts when p ends.
    assert schedule(simulate(WHOLE, 2, "first-fit"))["t"] == (1.5, (1,))
    assert schedule(simulate(WHOLE, 2, "first-fit"))["big"] == (3, (0, 1))


def stream_with_wide_task(until: float) -> list[Task]:
    """Half-GPU tasks of 1 s every 0.5 s on 2 GPUs, and one 2-GPU task arriving at 2.25."""
    small = [task(f"s{i}", i * 0.5, 0.5, 1.0) for i in range(int(until / 0.5))]
    return sorted([*small, task("wide", 2.25, 2, 1.0)], key=lambda t: t.arrival)


def wide_wait(result: Outcome) -> float:
    return next(run.wait for run in result.runs if run.task.name == "wide")


@pytest.mark.parametrize("until", [20.0, 40.0])
def test_wide_task_is_granted_in_bounded_time_under_hwpool(until: float) -> None:
    # Best fit keeps every small task on GPU 0; the wide one reserves both GPUs at once, so
    # it starts as soon as the two tasks running on GPU 0 finish: within one small duration.
    assert wide_wait(simulate(stream_with_wide_task(until), 2, "hwpool-reserve-all")) == 0.75


@pytest.mark.parametrize("until", [20.0, 40.0])
def test_wide_task_starves_under_greedy_first_fit(until: float) -> None:
    # First fit keeps refilling GPU 0 as each small task ends: the wide task waits for the
    # whole stream to end, however long it is.
    trace = stream_with_wide_task(until)
    last_end = max(t.arrival + t.duration for t in trace if t.name != "wide")
    assert wide_wait(simulate(trace, 2, "first-fit")) == last_end - 2.25
    assert wide_wait(simulate(trace, 2, "first-fit")) > until - 3


def test_simulation_is_deterministic() -> None:
    trace = stream_with_wide_task(10.0) + BACKFILL
    trace.sort(key=lambda t: t.arrival)
    for policy in POLICIES:
        assert simulate(trace, 3, policy) == simulate(trace, 3, policy)


def test_task_wider_than_the_machine_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"task 'big' needs 2 GPUs but gpus=1"):
        simulate(WHOLE, 1)


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        simulate(WHOLE, 2, "random")


def test_lower_bound_takes_work_arriving_late() -> None:
    # 4 GPU-seconds arriving at 10 on 2 GPUs: no schedule ends before 12.
    tasks = [task("a", 0, 0.5, 1), task("b", 10, 2, 2)]
    assert lower_bound(tasks, 2) == 12.0
    assert lower_bound([task("long", 1, 0.1, 9)], 4) == 10.0


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q must be"):
        percentile([1.0], 0)


demands = st.sampled_from([0.1, 0.25, 0.5, 0.6, 1.0, 2.0, 3.0])
tasks_strategy = st.lists(
    st.tuples(
        st.integers(0, 20).map(lambda n: n / 2),
        demands,
        st.integers(1, 8).map(lambda n: n / 2),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(tasks_strategy, st.sampled_from(POLICIES))
def test_every_policy_respects_capacity_and_arrivals(
    raw: list[tuple[float, float, float]], policy: str
) -> None:
    tasks = sorted(
        (task(f"t{i}", a, d, u) for i, (a, d, u) in enumerate(raw)), key=lambda t: t.arrival
    )
    result = simulate(tasks, 3, policy)
    assert len(result.runs) == len(tasks)
    assert result.makespan >= result.lower_bound - 1e-9
    assert 0 < result.utilization <= result.best_utilization + 1e-9
    for run in result.runs:
        assert run.start >= run.task.arrival
        assert len(set(run.gpus)) == run.task.count
    for moment in {run.start for run in result.runs}:
        used = [0] * 3
        for run in result.runs:
            if run.start <= moment < run.end:
                for gpu in run.gpus:
                    used[gpu] += run.task.units
        assert max(used) <= UNITS_PER_GPU


def test_progress_hears_the_tasks_started_about_every_percent() -> None:
    tasks = load_trace("embedding")
    heard: list[int] = []
    plain = simulate(tasks, 4, "first-fit")
    watched = simulate(tasks, 4, "first-fit", progress=heard.append)
    assert watched == plain
    assert heard == sorted(heard) and heard[-1] <= len(tasks)
    assert 50 <= len(heard) <= 120


def test_packing_bound_counts_that_big_tasks_never_share_a_gpu() -> None:
    u = fraction_to_units(0.6)
    tasks = [Task(f"t{i}", 0.0, 1, u, 1.0) for i in range(1000)]
    assert lower_bound(tasks, 4) == pytest.approx(150.0)  # the work alone: 600 GPU-s over 4
    assert packing_bound(tasks, 4) == pytest.approx(250.0)  # one 0.6 task per GPU at a time
    result = simulate(tasks, 4, "first-fit")
    assert result.packing_bound == pytest.approx(250.0) and result.makespan == pytest.approx(250.0)


def test_packing_bound_lets_halves_share_and_counts_whole_gpus() -> None:
    halves = [Task(f"h{i}", 0.0, 1, fraction_to_units(0.5), 2.0) for i in range(8)]
    assert packing_bound(halves, 2) == lower_bound(halves, 2) == pytest.approx(4.0)  # two a GPU
    wide = [Task("w", 0.0, 2, UNITS_PER_GPU, 3.0)]
    big = [Task(f"b{i}", 0.0, 1, fraction_to_units(0.51), 1.0) for i in range(4)]
    # work: 6 + 2.04 GPU-s over 2 GPUs = 4.02 s; exclusive: 6 + 4 GPU-s over 2 = 5 s.
    assert lower_bound(wide + big, 2) == pytest.approx(4.02)
    assert packing_bound(wide + big, 2) == pytest.approx(5.0)
