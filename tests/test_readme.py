"""The README's in-process example runs as printed, and its set-up commands are the ones CI runs."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from docblocks import blocks_tested_by
from hwpool import GPUPool

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_example_runs_as_printed_in_this_environment() -> None:
    # Run as a user would, with the environment as it is: on a machine with no GPU that means
    # one logical GPU. (Before, the example asked for lease_full(2) and crashed there; its test
    # hid that by setting HWPOOL_NUM_GPUS=4.)
    (code,) = (block.code for block in blocks_tested_by(__file__))
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    num_gpus = GPUPool().num_gpus  # what the example's GPUPool() finds here
    lines = result.stdout.splitlines()
    assert lines[0] == f"TP job on {list(range(min(2, num_gpus)))}"
    assert len(lines) == 11
    used = Counter(int(line.rsplit(" ", 1)[1]) for line in lines[1:])
    assert sum(used.values()) == 10 and set(used) <= set(range(num_gpus))
    if num_gpus >= 4:  # quarters fill GPUs 2 and 3 beside the 2-GPU job, the rest waits
        assert used == {2: 4, 3: 4, 0: 2}


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", README)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


FIGURE = re.compile(r"\d[\d,.]*\d|\d")
"""A figure as the README writes it: 5.59, 2,200, 1.022 (a trailing unit or x aside)."""


def test_the_readmes_figures_are_the_reference_pages() -> None:
    # The README's short table quotes docs/performance.md (and the fairness figure of
    # docs/scheduling.md); when a figure there changes, this says which one to update here.
    section = README.split("## Figures that matter", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    assert len(rows) >= 8
    pages = "".join(
        (ROOT / "docs" / name).read_text() for name in ("performance.md", "scheduling.md")
    )
    for row in rows:
        figures = row.split(" | ")[1]
        for figure in FIGURE.findall(figures):
            assert figure in pages, f"the README's {figure} ({figures}) is not in docs/"
