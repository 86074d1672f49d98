"""The scheduler's decisions, pinned: every simulator policy on every golden trace and
machine, and the core driven directly, must answer exactly what ``tests/sim/golden`` holds
(recorded from the code before the core was split into parts; ``record.py`` rewrites it)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"


def _recorder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_golden_record", GOLDEN / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


record = _recorder()


def _fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_text())
    return loaded


def _first_difference(expected: Any, actual: Any, where: str = "") -> str:
    """Where two JSON values first differ, for a readable failure."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in expected.keys() | actual.keys():
            if expected.get(key) != actual.get(key):
                return _first_difference(expected.get(key), actual.get(key), f"{where}/{key}")
    if isinstance(expected, list) and isinstance(actual, list):
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            if e != a:
                return _first_difference(e, a, f"{where}[{i}]")
        return f"{where}: length {len(expected)} != {len(actual)}"
    return f"{where}: expected {expected!r}, got {actual!r}"


@pytest.mark.parametrize("trace", sorted(record.traces()))
def test_simulated_schedules_match_the_golden_ones(trace: str) -> None:
    make, machines = record.traces()[trace]
    expected = _fixture(trace)
    actual = json.loads(json.dumps(record.record_trace(make, machines)))
    assert actual == expected, _first_difference(expected, actual)


def test_every_simulator_policy_and_both_machines_are_pinned() -> None:
    keys = _fixture("P1").keys()
    assert {key.split("/")[1] for key in keys} == set(record.POLICIES)
    assert {key.split("/")[0] for key in keys} == {"equal", ",".join(map(str, record.UNEQUAL))}


@pytest.mark.parametrize("config", sorted(record.CONFIGS))
def test_the_core_driven_directly_answers_as_recorded(config: str) -> None:
    expected = {k: v for k, v in _fixture("core-scripts").items() if k.startswith(config + "/")}
    assert expected
    for key, log in expected.items():
        _, policy, backfill, seed = key.split("/")
        log_now = record.script(config, policy, backfill, int(seed), record.STEPS)
        actual = json.loads(json.dumps(log_now))
        assert actual == log, f"{key}: {_first_difference(log, actual)}"
