"""bench/bench_watch.py runs end to end (a smoke run: its figures are not checked)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_watch.py"


def test_the_watcher_bench_prints_each_part_and_the_share_of_a_core(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = importlib.util.spec_from_file_location("bench_watch", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--quick"])
    lines = table.splitlines()
    assert "2 GPUs, 10 GPU processes: 8 on 2 leases, 2 outside" in lines[0]
    assert lines[1].split() == ["part", "of", "one", "step", "CPU", "ms/sample", "%", "of", "one",
                                "core", "aim"]  # fmt: skip
    for line, label in zip(
        lines[2:5], ["NVML sample", "attribution", "whole watcher step"], strict=True
    ):
        assert line.startswith(label) and line.rstrip().endswith(("%", "< 1%"))
    assert lines[5] == "(one sample every 2 s)"
    assert capsys.readouterr().out == ""  # the table is returned; hwpool bench prints it
