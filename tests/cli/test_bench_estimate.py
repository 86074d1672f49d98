"""The estimate benchmark (bench_estimate.py) runs end to end: a header and a row per trace,
policy and limits, its counts consistent (its figures are not judged: a benchmark reports)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_estimate.py"


@pytest.mark.timeout(120)
def test_bench_prints_a_row_per_trace_policy_and_limits(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_estimate", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--quick", "--trace", "P2,serving", "--samples", "10"])
    lines = table.splitlines()
    assert lines[1].split()[:5] == ["trace", "policy", "limits", "waits", "unknown"]
    rows = [line.split() for line in lines[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (trace, policy, limits)
        for trace in ("P2", "serving")
        for policy in ("easy", "reserve-all")
        for limits in ("no", "yes")
    ]
    for row in rows:
        waits, unknown = int(row[3]), int(row[4])
        assert 0 <= unknown <= waits
        if row[2] == "yes":
            assert unknown == 0  # every task has a limit: every wait is bounded
    assert table in capsys.readouterr().out
