"""The code example of docs/jobs.md runs, and prints what the page says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"


def test_the_pages_python_example_runs_as_shown() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    shown = [line.strip().removeprefix("# ") for line in blocks[0].splitlines()
             if line.strip().startswith("# ")]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], f"{DOC}:python", "exec"), {})
    assert printed.getvalue().splitlines() == shown
