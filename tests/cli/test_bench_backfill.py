"""The backfill benchmark runs end to end as a script (its figures are not judged: a
benchmark reports), with a line per part."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_backfill.py"


def test_quick_run_prints_every_part() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for title in ("== 1. the liar", "== 2a. bimodal", "== 2b. a 100x jump", "== 3. throughput"):
        assert title in proc.stdout
    assert "adaptive: 8 x 0.25 GPU hinting 0.01 s" in proc.stdout
