"""bench/bench_ray.py runs end to end on the session's cluster (a smoke run: its figures are
not checked, except that hwpool.ray never loaded a GPU past one)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ray = pytest.importorskip("ray")

# Bounded, but with room for Ray to start its workers on a loaded 2-core machine: beside two
# busy loops the warm-up alone took over 120 s once.
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the tasks it ships are pickled by value from here
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


def test_the_ray_bench_compares_both_on_a_quick_workload(cluster: Any) -> None:
    bench = load("bench_ray")
    out = bench.compare(bench.QUICK)
    table = bench.table(out, bench.QUICK, bench.loopback_only())
    for label in ("mixed: makespan", "200 ms mix", "probe:", "per-task overhead", "plain Ray"):
        assert label in table
    assert out["hwpool.ray"]["peak"] <= 1.0
    assert "all on 127.0.0.1" in table or "no ss" in table
