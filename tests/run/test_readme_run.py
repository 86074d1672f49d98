"""The README's `lease.run` example runs as printed, and prints the leased GPU's id."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_lease_run_example_prints_the_leased_device() -> None:
    found = re.search(r"for local pools and pools of the server alike:\n\n```python\n(.*?)```",
                      README, re.S)  # fmt: skip
    assert found is not None
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "GPU-x,GPU-y", "PYTHONPATH":
           str(Path(__file__).resolve().parents[2] / "src")}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", found.group(1)], capture_output=True, text=True, env=env,
        timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "GPU-x\n"
