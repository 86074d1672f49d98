"""The CPU-pool benchmark runs end to end (a smoke run; its figures are not checked)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_cpu_pool.py"


def test_bench_main_returns_the_printed_table(capsys: object) -> None:
    spec = importlib.util.spec_from_file_location("bench_cpu_pool", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.main(["--quick"])
    for label in ("ThreadPoolExecutor", "multiprocessing ThreadPool", "CPUPool.run_rows", "BLAS"):
        assert label in table
    assert table in capsys.readouterr().out  # type: ignore[attr-defined]
