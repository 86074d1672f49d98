"""The simulator scaling benchmark runs end to end (a smoke run; its figures are not checked)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_sim_scale.py"


def test_bench_prints_a_row_per_policy_and_the_ratio(capsys: object) -> None:
    spec = importlib.util.spec_from_file_location("bench_sim_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--sizes", "300,600", "--rounds", "1", "--policy", "fifo,first-fit"])
    lines = table.splitlines()
    assert lines[1].split() == ["policy", "300", "600", "600/300"]
    assert [line.split()[0] for line in lines[2:]] == ["fifo", "first-fit"]
    assert all(line.endswith("x") for line in lines[2:])
    assert table in capsys.readouterr().out  # type: ignore[attr-defined]
