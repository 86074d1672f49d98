"""The fairness benchmark runs end to end as a script (its figures are not judged: a
benchmark reports), with a line per part."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_fairness.py"


def test_quick_run_prints_every_part() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for title in ("== 1. the flood", "== 2. shares", "one owner alone", "== 3. cost"):
        assert title in proc.stdout
