"""The README's main-job example runs end to end as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mixed_workload_example_runs_and_returns_every_gpu() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mixed_workload.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert sum(" on GPU " in line for line in lines) == 40
    assert any("2 GPUs" in line for line in lines)
    assert lines[-1] == "granted 40, released 40, free (1.0, 1.0, 1.0, 1.0)"
