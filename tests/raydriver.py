"""Run a Ray driver script in a fresh interpreter, for tests that need a cluster of their own
(another shape than the session's): it starts and stops its cluster itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def run_driver(code: str, timeout: float) -> str:
    """Run ``code`` with this checkout's ``src`` first on the path and no inherited
    ``RAY_ADDRESS`` (so it starts its own cluster); its stdout's last line. The test fails
    with the driver's stderr if it exits with an error."""
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]
