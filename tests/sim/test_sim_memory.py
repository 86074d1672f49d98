"""Simulating GPUs sized in memory: the shipped serving trace on 80 GiB + 24 GiB, every policy."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hwpool._cli._report import outcomes_json
from hwpool._sim._machine import held_on, task_demand
from hwpool._sim._simulate import POLICIES, simulate
from hwpool._sim._trace import load_trace, parse_trace

MACHINE = (80 * 1024, 24 * 1024)


def held_in_mib(runs, gpu: int, totals) -> int:  # type: ignore[no-untyped-def]
    """The most MiB held on ``gpu`` at any instant, each run holding what the core counts
    (ends before starts at one instant)."""
    events = []
    for run in runs:
        if gpu in run.gpus:
            amount = held_on(task_demand(run.task, totals), totals[gpu])
            events += [(run.start, 1, amount), (run.end, 0, -amount)]
    level = peak = 0
    for _, _, change in sorted(events):
        level += change
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_the_serving_trace_within_each_gpus_memory(policy: str) -> None:
    tasks = load_trace("serving")
    result = simulate(tasks, 2, policy, gpu_memory=MACHINE)
    assert len(result.runs) == len(tasks) and result.gpu_memory == MACHINE
    for gpu in (0, 1):
        assert held_in_mib(result.runs, gpu, MACHINE) <= MACHINE[gpu]
    for run in result.runs:
        if run.task.memory_mib == 44 * 1024:
            assert run.gpus == (0,)  # 44 GiB fits the large card only
    assert 0 < result.utilization <= result.best_utilization <= 1
    assert result.makespan >= result.lower_bound
    labels = [c.label for c in result.classes]
    assert labels == ["2GiB", "6GiB", "16GiB", "24GiB", "44GiB"]


def test_memory_tasks_need_a_machine_sized_in_memory() -> None:
    tasks = load_trace("serving")
    with pytest.raises(ValueError, match=r"asks for memory \(6GiB\): describe the GPUs' memory"):
        simulate(tasks, 2)
    with pytest.raises(ValueError, match="more than the largest GPU"):
        simulate(tasks, 2, gpu_memory=(24 * 1024, 24 * 1024))
    with pytest.raises(ValueError, match="gpu_memory lists 2 GPUs but num_gpus=3"):
        simulate(tasks, 3, gpu_memory=MACHINE)


def test_a_fraction_is_that_share_of_the_gpu_it_runs_on() -> None:
    tasks = parse_trace('{"arrival": 0, "demand": 0.5, "duration": 1}\n', fmt="jsonl")
    same = simulate(tasks, 2, gpu_memory=(81920, 81920))
    assert same.runs[0].share == 0.5
    mixed = simulate(tasks, 2, gpu_memory=MACHINE)  # best fit: 12 GiB left on the small card
    assert mixed.runs[0].gpus == (1,) and mixed.runs[0].share == 0.5
    # Work: 12 GiB for 1 s of the machine's 104 GiB; the bound counts the smallest GPU's share.
    assert mixed.utilization == pytest.approx(12 / 104)
    assert mixed.lower_bound == 1.0
    whole = parse_trace('{"arrival": 0, "demand": 2, "duration": 1}\n', fmt="jsonl")
    assert simulate(whole, 2, gpu_memory=(81920, 81920)).runs[0].gpus == (0, 1)


FRACTION_TRACE = """\
{"name": "a", "arrival": 0, "demand": 0.5, "duration": 10}
{"name": "b", "arrival": 0, "demand": 0.5, "duration": 10}
{"name": "c", "arrival": 0, "demand": 0.5, "duration": 10}
{"name": "d", "arrival": 0, "demand": 0.75, "duration": 1}
{"name": "e", "arrival": 1, "memory": "30GiB", "duration": 2}
{"name": "f", "arrival": 2, "demand": 0.25, "duration": 3}
{"name": "g", "arrival": 3, "demand": 1, "duration": 1}
"""


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_runs_fractions_on_a_mixed_machine(policy: str) -> None:
    tasks = parse_trace(FRACTION_TRACE, fmt="jsonl")
    result = simulate(tasks, 2, policy, gpu_memory=MACHINE)
    runs = {run.task.name: run for run in result.runs}
    for gpu in (0, 1):
        assert held_in_mib(result.runs, gpu, MACHINE) <= MACHINE[gpu]
    for name in "abcdf":  # each holds its share of the GPU it ran on
        run = runs[name]
        assert run.share == pytest.approx(run.task.demand, abs=1e-6)
    # Two halves fit the small card (12 GiB each) and two the large (40 GiB each).
    assert sorted(runs[n].gpus[0] for n in "abc") in ([0, 1, 1], [0, 0, 1])
    assert all(runs[n].start == 0 for n in "abc")
    assert 0 < result.utilization <= result.best_utilization <= 1
    assert result.makespan >= result.lower_bound
    if policy in ("hwpool", "hwpool-reserve-all", "fifo"):  # best fit, least left
        assert [runs[n].gpus for n in "abc"] == [(1,), (1,), (0,)]
    if policy in ("hwpool", "hwpool-reserve-all"):
        # 0.75 needs 60 GiB on GPU 0 (40 free: 20 short), 18 on GPU 1 (none free: 18 short):
        # it reserves GPU 1, the closer, so 30 GiB starts at once beside "c" on GPU 0.
        assert runs["d"].gpus == (1,) and runs["d"].start == 10
        assert runs["e"].gpus == (0,) and runs["e"].start == 1
        assert runs["f"].gpus == (0,) and runs["f"].start == 3  # 20 GiB, once "e" ends
    if policy == "first-fit":  # the lowest-indexed GPU that fits: two halves of 80 GiB
        assert [runs[n].gpus for n in "abc"] == [(0,), (0,), (1,)]


def test_simulate_command_on_a_mixed_machine_with_fractions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "fractions.jsonl"
    trace.write_text(FRACTION_TRACE)
    proc = _hwpool("simulate", str(trace), "--gpu-memory", "80GiB,24GiB", "--policy", "all")
    assert proc.returncode == 0, proc.stderr
    assert "0.5 GPU x3" in proc.stdout and "0.75 GPU x1" in proc.stdout


MIXED_TRACE = """\
{"name": "big", "arrival": 0, "memory": "70GiB", "duration": 4}
{"name": "one", "arrival": 1, "demand": 1, "duration": 2}
{"name": "both", "arrival": 2, "demand": 2, "duration": 3}
{"name": "small", "arrival": 3, "memory": "6GiB", "duration": 1}
{"name": "one", "arrival": 9, "demand": 1, "duration": 1}
"""


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpu_tasks_take_completely_free_gpus_of_any_size(policy: str) -> None:
    tasks = parse_trace(MIXED_TRACE, fmt="jsonl")
    result = simulate(tasks, 2, policy, gpu_memory=MACHINE)
    runs = {(run.task.name, run.task.arrival): run for run in result.runs}
    assert runs["one", 1].gpus == (1,)  # the 24 GiB card is completely free at once
    assert runs["one", 1].start == 1 and runs["one", 1].share == 1.0
    both = runs["both", 2]
    assert both.gpus == (0, 1) and both.share == 1.0
    assert both.start >= 4  # needs the 80 GiB card completely free: after "big"
    for run in result.runs:  # nothing shares a GPU with a whole-GPU task
        if run.task.memory_mib is None:
            for other in result.runs:
                if other is not run and set(other.gpus) & set(run.gpus):
                    assert other.end <= run.start or other.start >= run.end
    if policy in ("hwpool", "hwpool-reserve-all"):  # best fit: the smallest completely free GPU
        assert runs["one", 9].gpus == (1,)
    assert 0 < result.utilization <= result.best_utilization <= 1
    assert result.makespan >= result.lower_bound


def test_whole_gpu_work_counts_each_gpus_total() -> None:
    tasks = parse_trace('{"arrival": 0, "demand": 2, "duration": 1}\n', fmt="jsonl")
    result = simulate(tasks, 2, gpu_memory=MACHINE)
    assert result.runs[0].gpus == (0, 1)
    assert result.utilization == pytest.approx(1.0)
    too_many = parse_trace('{"arrival": 0, "demand": 3, "duration": 1}\n', fmt="jsonl")
    with pytest.raises(ValueError, match="needs 3 GPUs but gpus=2"):
        simulate(too_many, 2, gpu_memory=MACHINE)


def test_json_output_reads_back_with_its_memory() -> None:
    tasks = load_trace("serving")
    doc = outcomes_json([simulate(tasks, 2, gpu_memory=MACHINE)])
    assert doc["gpu_memory"] == list(MACHINE)
    again = parse_trace(json.dumps(doc), fmt="jsonl")
    assert sorted((t.name, t.memory_mib, t.count) for t in again) == sorted(
        (t.name, t.memory_mib, t.count) for t in tasks
    )


def _hwpool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_the_command_compares_policies_on_a_mixed_machine() -> None:
    proc = _hwpool("simulate", "serving", "--gpu-memory", "80GiB,24GiB", "--policy", "all")
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("serving: ") and first.endswith(
        "on 2 GPUs (80GiB + 24GiB) (virtual time)"
    )
    assert "44GiB x6" in proc.stdout


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["--gpu-memory", "80GiB,6 gigs"], "GPU 1's memory must be an int of MiB"),
        (["--gpu-memory", "80GiB", "--gpus", "2"], "give --gpus or --gpu-memory, not both"),
        (["--gpus", "2"], "asks for memory (6GiB)"),
    ],
)
def test_bad_machines_are_one_line_errors(args: list[str], what: str) -> None:
    proc = _hwpool("simulate", "serving", *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert what in proc.stderr and "Traceback" not in proc.stderr
