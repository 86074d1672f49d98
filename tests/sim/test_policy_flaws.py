"""The three flaws of the old policy (issue 9), on the traces of ``tests/sim/traces``.

For each of P1, P2 and P3 (see that folder's README.md): the old policy
(``hwpool-reserve-all``) shows the flaw, with the figures the trace was built for, a baseline
shows that the flaw is the policy's and not the trace's, and the new policy (``hwpool``) does
not show it.

Everything runs in the simulator's virtual time: deterministic, no sleeping. Each test relies
on the suite's default timeout (``timeout = 60`` in pyproject.toml).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from hwpool._sim._simulate import POLICIES, Outcome, TaskRun, simulate
from hwpool._sim._trace import Task, load_trace

TRACES = Path(__file__).resolve().parent / "traces"
GPUS = 4


@functools.cache
def tasks_of(trace: str) -> tuple[Task, ...]:
    return tuple(load_trace(str(TRACES / f"{trace}.csv"), max_gpus=GPUS))


@functools.cache
def run(trace: str, policy: str) -> Outcome:
    return simulate(tasks_of(trace), GPUS, policy)


def runs_named(trace: str, policy: str, prefix: str) -> list[TaskRun]:
    return [r for r in run(trace, policy).runs if r.task.name.startswith(prefix)]


def head(trace: str, policy: str) -> TaskRun:
    (found,) = runs_named(trace, policy, "head")
    return found


def p99_wait(trace: str, policy: str, label: str) -> float:
    (stats,) = [c for c in run(trace, policy).classes if c.label == label]
    return stats.p99


def make_traces() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_traces", TRACES / "make_traces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checked_in_traces_are_what_make_traces_writes() -> None:
    texts = make_traces().texts()
    assert sorted(texts) == ["P1.csv", "P2.csv", "P3.csv"]
    for filename, text in texts.items():
        assert (TRACES / filename).read_text(encoding="utf-8") == text, filename


# P1: 4 x 0.6 GPU for 100 s, 4 whole-GPU waiters at t=0.1, 400 x 0.1 GPU of 1 s from t=0.2.


def test_p1_whole_gpu_tasks_start_at_100_under_every_policy() -> None:
    for policy in POLICIES:
        starts = [r.start for r in runs_named("P1", policy, "whole")]
        assert starts == [100.0] * 4, policy


def test_p1_old_policy_makes_the_tiny_tasks_wait_for_the_whole_gpu_tasks() -> None:
    assert 100.0 <= p99_wait("P1", "hwpool-reserve-all", "0.1 GPU") <= 115.0  # 109.4
    assert min(r.start for r in runs_named("P1", "hwpool-reserve-all", "small")) == 110.0
    assert run("P1", "hwpool-reserve-all").makespan == pytest.approx(120.0)


def test_p1_first_fit_backfills_them_at_once() -> None:
    assert p99_wait("P1", "first-fit", "0.1 GPU") == 0.0
    assert run("P1", "first-fit").makespan == pytest.approx(110.0)
    assert run("P1", "first-fit").packing_bound == pytest.approx(110.0)


def test_p1_new_policy_backfills_the_tiny_tasks() -> None:
    assert p99_wait("P1", "hwpool", "0.1 GPU") < 2.0
    assert run("P1", "hwpool").makespan <= 111.0


# P2: a 2-GPU head at t=100 whose most-free GPUs (0-1) stay busy until t=300.


def test_p2_old_policy_reserves_the_gpus_that_free_up_last() -> None:
    old = head("P2", "hwpool-reserve-all")
    assert old.gpus == (0, 1)
    assert old.wait == pytest.approx(200.0, abs=5.0)


def test_p2_fifo_starts_the_head_once_the_short_tasks_drain() -> None:
    fifo = head("P2", "fifo")
    assert fifo.gpus == (2, 3)
    assert fifo.wait <= 2.5  # 1.56: the stream's tasks last under 2 s


def test_p2_new_policy_starts_the_head_soon() -> None:
    assert head("P2", "hwpool").wait <= 10.0


# P3: reservations hop; every job lasts at most 3.5 s.


def test_p3_every_job_is_short() -> None:
    assert max(task.duration for task in tasks_of("P3")) <= 3.5


def test_p3_old_policy_hops_and_the_head_waits_for_the_whole_stream() -> None:
    assert head("P3", "hwpool-reserve-all").wait >= 200.0  # 271.35


def test_p3_fifo_starts_the_head_within_a_few_seconds() -> None:
    assert head("P3", "fifo").wait <= 5.0  # 1.35


def test_p3_new_policy_keeps_the_head_waiting_a_bounded_time() -> None:
    assert head("P3", "hwpool").wait <= 10.0
