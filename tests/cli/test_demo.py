"""The demo workload and its two stages (short runs: a second or so of real time)."""

from __future__ import annotations

import pytest

from hwpool._cli._demo import DEMO_GPUS, demo_workload, run_cpu_stage, run_gpu_stage
from hwpool._sim._simulate import outcome


def test_workload_is_fixed_and_scales() -> None:
    full = demo_workload()
    assert full == demo_workload()
    labels = {t.label for t in full}
    assert labels == {"0.1 GPU", "0.2 GPU", "0.25 GPU", "0.5 GPU", "2 GPUs"}
    assert sum(t.count == 2 for t in full) == 3
    half = demo_workload(4.0)
    assert [t.arrival / 2 for t in full] == pytest.approx([t.arrival for t in half])
    assert [t.duration / 2 for t in full] == pytest.approx([t.duration for t in half])
    with pytest.raises(ValueError, match="seconds must be > 0"):
        demo_workload(0)


def test_gpu_stage_runs_every_call_on_a_real_pool() -> None:
    tasks = demo_workload(0.8)
    finished: list[None] = []
    runs = run_gpu_stage(tasks, DEMO_GPUS, lambda: finished.append(None))
    assert len(runs) == len(finished) == len(tasks)
    for run in runs:
        assert run.start >= run.task.arrival
        assert run.end >= run.start + run.task.duration
        assert len(run.gpus) == run.task.count
        assert all(0 <= g < DEMO_GPUS for g in run.gpus)
    result = outcome("measured", DEMO_GPUS, runs)
    assert result.makespan >= result.lower_bound


def test_cpu_stage_checks_its_digests() -> None:
    stage = run_cpu_stage(6)
    assert stage.rows == 6
    assert stage.team >= 1
    assert stage.serial_s > 0
    assert stage.pool_s > 0
    assert stage.speedup == stage.serial_s / stage.pool_s
    with pytest.raises(ValueError, match="rows must be >= 1"):
        run_cpu_stage(0)
