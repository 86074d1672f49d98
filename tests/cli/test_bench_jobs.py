"""The job table benchmark runs end to end (a smoke run; its figures are not checked here:
they are absolute aims, printed beside each figure)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_jobs.py"


def test_bench_prints_each_figure_beside_its_aim(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_jobs", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--jobs", "30"])
    lines = table.splitlines()
    assert lines[1].split() == ["measure", "result", "aim"]
    assert lines[2].startswith("add 30 jobs (total)") and lines[2].endswith("< 10 s for 500")
    assert lines[3].startswith("open + list 30 jobs (best of 5)")
    assert lines[3].endswith("< 200 ms for 500")
    assert lines[4].endswith("MiB  < 50 MiB (the supervisor)")
    assert table in capsys.readouterr().out
