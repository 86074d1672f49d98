"""The code examples of docs/jobs.md run, and print what the page says they print."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from docblocks import blocks_tested_by

DOC = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"


def test_the_pages_python_examples_run_as_shown() -> None:
    blocks = [block.code for block in blocks_tested_by(__file__)]
    assert len(blocks) == 2  # the table, and hwpool.Job
    for index, block in enumerate(blocks):
        shown = [line.strip().removeprefix("# ") for line in block.splitlines()
                 if line.strip().startswith("# ")]  # fmt: skip
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"{DOC}:python:{index}", "exec"), {})
        assert printed.getvalue().splitlines() == shown
