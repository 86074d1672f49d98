"""The sample outputs in README.md and docs/*.md of commands whose output is deterministic are
the commands' output today: each is run, and its output compared with the block.

A code block shows such an output when an HTML comment right before it says which command:

    <!-- output-of: hwpool simulate batch --policy hwpool,first-fit -->
    ```
    $ hwpool simulate batch --policy hwpool,first-fit
    batch: 274 tasks on 4 GPUs (virtual time)
    ...
    ```

The whole output must match (trailing spaces and blank lines aside). ``hwpool demo`` runs in
real time, so only its ``simulated`` column is deterministic: a block marked
``<!-- simulated-column-of: hwpool demo -->`` has that column checked, its measured one not.
Before, the figures went stale although the simulator is deterministic (issue 22).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
from pathlib import Path

import pytest

from hwpool._cli import _demo, _report, main
from hwpool._sim import _simulate

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKED = re.compile(r"<!-- (output-of|simulated-column-of): (.+?) -->\n```[a-z]*\n(.*?)```", re.S)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One marked block: where it is, which check, the command, and the block's text."""

    where: str
    kind: str
    command: str
    block: str

    def __str__(self) -> str:
        return f"{self.where}: {self.command}"


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def samples() -> list[Sample]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in MARKED.finditer(text):
            where = f"{path.relative_to(ROOT)}:{_line_of(text, match.start())}"
            found.append(Sample(where, match.group(1), match.group(2), match.group(3)))
    return found


def _normal(text: str) -> list[str]:
    """The lines without trailing spaces, without trailing blank lines."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _shown_output(sample: Sample) -> list[str]:
    """What the block shows after its ``$ COMMAND`` line, up to the next ``$`` line."""
    lines = sample.block.splitlines()
    start = lines.index(f"$ {sample.command}")  # ValueError: the block must show the command
    shown = []
    for line in lines[start + 1 :]:
        if line.startswith("$ "):
            break
        shown.append(line)
    return _normal("\n".join(shown))


def _run(command: str) -> list[str]:
    """``hwpool ARGS`` run in this process (the simulator is fast); its stdout, checked."""
    argv = shlex.split(command)
    assert argv[0] == "hwpool", f"only hwpool commands are run here, not {command!r}"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv[1:])
    assert code == 0, err.getvalue()
    return _normal(out.getvalue())


OUTPUTS = [s for s in samples() if s.kind == "output-of"]


@pytest.mark.parametrize("sample", OUTPUTS, ids=str)
def test_the_sample_output_is_what_the_command_prints(sample: Sample) -> None:
    shown = _shown_output(sample)
    printed = _run(sample.command)
    assert shown == printed, (
        f"{sample.where}: the block differs from what `{sample.command}` prints now; "
        "paste this output (and fix any figure quoted from it in the text):\n" + "\n".join(printed)
    )


ROW = re.compile(r"(.*?\S)\s{2,}(.*)")
"""A table row: its label (up to the first run of two spaces or more), then its cells."""


def _simulated_column(lines: list[str]) -> list[tuple[str, str]]:
    """Each table row's label and its last cell (the simulated column); class headings
    (``0.1 GPU x30``) have no cells. The table ends at a blank line."""
    rows = []
    for line in lines:
        if not line:
            break
        row = ROW.fullmatch(line)
        rows.append((line, "") if row is None else (row.group(1), row.group(2).split()[-1]))
    return rows


@pytest.mark.parametrize(
    "sample", [s for s in samples() if s.kind == "simulated-column-of"], ids=str
)
def test_the_demo_samples_simulated_column_is_the_simulators(sample: Sample) -> None:
    assert sample.command == "hwpool demo"
    shown = _shown_output(sample)
    tasks = _demo.demo_workload(_demo.DEMO_SECONDS)
    predicted = _simulate.simulate(tasks, _demo.DEMO_GPUS)
    columns = [
        dataclasses.replace(predicted, policy=p) for p in ("GPUPool (measured)", "simulated")
    ]
    table = _report.format_table(columns)
    expected = _simulated_column(_normal(table))
    assert shown[0].startswith("GPU stage: "), shown[0]
    assert _simulated_column(shown[1:]) == expected, (
        f"{sample.where}: the simulated column differs from the simulator's; it prints:\n{table}"
    )


def test_every_shown_simulation_is_marked() -> None:
    # A new sample output of `hwpool simulate` (deterministic) must be checked too.
    marked = {(s.where.split(":")[0], s.command) for s in samples()}
    for path in DOCS:
        for command in re.findall(r"^\$ (hwpool (?:simulate|demo)\b.*)$", path.read_text(), re.M):
            name = str(path.relative_to(ROOT))
            assert (name, command) in marked, f"{name}: `{command}` shown but not marked"
    assert len(OUTPUTS) >= 3
