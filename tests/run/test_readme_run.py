"""docs/run.md's `lease.run` example runs as printed, and prints the leased GPU's id."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import hermetic
from docblocks import blocks_tested_by


def test_the_lease_run_example_prints_the_leased_device() -> None:
    (code,) = (block.code for block in blocks_tested_by(__file__))
    env = {**hermetic.own(), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "GPU-x,GPU-y",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env,
        timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "GPU-x\n"
