"""The jobs benchmark runs end to end (a smoke run of 30 jobs on a real server and
supervisor; its figures are not checked here: they are absolute aims, printed beside each
figure)."""

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
    assert lines[2].startswith("hwpool.submit x 30 (in all)")
    assert lines[2].endswith("< 10 s for 500")
    assert lines[4].startswith("hwpool jobs, 30 queued (in-process)")
    assert lines[4].endswith("< 200 ms for 500")
    assert lines[5].startswith("hwpool jobs as a process") and "python -c pass" in lines[5]
    assert lines[-2].startswith("supervisor RSS, 30 queued") and lines[-2].endswith("< 50 MiB")
    assert lines[-1].startswith("hwpool submit --from FILE, 30 lines")
    assert lines[-1].endswith("< 10 s for 500")
    assert table in capsys.readouterr().out
