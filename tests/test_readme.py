"""The README's example runs as printed, and its set-up commands are the ones CI runs."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_example_runs_on_four_logical_gpus() -> None:
    code = re.search(r"## Example\n\n```python\n(.*?)```", README, re.S)
    assert code is not None
    result = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"HWPOOL_NUM_GPUS": "4", "PATH": "/usr/bin:/bin"},
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "TP job on [0, 1]"
    assert len(lines) == 11
    used = Counter(line.rsplit(" ", 1)[1] for line in lines[1:])
    # Quarter-GPU calls fill GPUs 2 and 3 beside the 2-GPU job (best fit: one GPU at a time);
    # the last two wait and then share GPU 0 once the 2-GPU job is done.
    assert used == {"2": 4, "3": 4, "0": 2}


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", README)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()
