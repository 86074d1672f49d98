"""The queue scaling benchmark runs end to end (a smoke run; its figures are not checked)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_queue.py"


def test_bench_prints_a_row_per_size_with_its_ratio(capsys: object) -> None:
    spec = importlib.util.spec_from_file_location("bench_queue", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--sizes", "300,600", "--rounds", "1"])
    lines = table.splitlines()
    assert lines[1].split() == ["tasks", "us/task", "ratio"]
    assert [line.split()[0] for line in lines[2:]] == ["300", "600"]
    assert lines[2].endswith("1.00x")
    assert table in capsys.readouterr().out  # type: ignore[attr-defined]


def test_cost_prints_a_row_per_mix_for_releases_and_cancels(capsys: object) -> None:
    spec = importlib.util.spec_from_file_location("bench_queue", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--cost", "--cost-sizes", "200,400", "--timed", "16"])
    rows = [line.split()[:2] for line in table.splitlines()[2:]]
    assert rows == [
        [what, mix] for what in ("release", "cancel") for mix in ("hinted", "distinct", "mixed")
    ]
    assert table in capsys.readouterr().out  # type: ignore[attr-defined]
