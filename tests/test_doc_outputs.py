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
docs/performance.md's table of ``bench/bench_policy.py`` figures (virtual time too) is checked
against the benchmark's own results. Before, the figures went stale although the simulator is
deterministic (issue 22).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from hwpool._cli import _demo, _report, main
from hwpool._sim import _simulate

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCH_POLICY = ROOT / "bench" / "bench_policy.py"
PERFORMANCE = ROOT / "docs" / "performance.md"
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


# docs/performance.md's table of the policy benchmark (`python bench/bench_policy.py`, seed 9:
# virtual time, so the same figures everywhere): each row's label, and the traces it gives.
POLICY_ROWS = {
    "stream at 50% load + one 4-GPU task": ("stream-50",),
    "stream at 70%": ("stream-70",),
    "stream at 90%": ("stream-90",),
    "heavy-tailed (lognormal sigma 1.5; 0.1-2 GPUs)": ("heavy-tail",),
    "gang jobs of 1-4 GPUs": ("gang",),
    "1000 x 0.6 GPU at t=0": ("pack-0.6",),
    "burst of 10,000 mixed tasks at t=0": ("burst",),
    "P1, P2, P3 (see the scheduling policy)": ("P1", "P2", "P3"),
    "`batch`, `embedding`": ("batch", "embedding"),
}
TABLE_POLICIES = ("hwpool", "hwpool-reserve-all", "fifo", "first-fit")
POLICY_HEADER = "| trace | `hwpool` (easy) | `hwpool-reserve-all` | `fifo` | `first-fit` |"


def _policy_table() -> dict[str, list[str]]:
    """docs/performance.md's policy table: row label -> its other cells."""
    lines = PERFORMANCE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(POLICY_HEADER))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        label, *cells = (cell.strip() for cell in line.strip("|").split("|"))
        rows[label] = cells
    return rows


def _written_as(value: float, shown: str) -> set[str]:
    """``value`` with as many decimals as ``shown`` has: rounded from itself, or from the
    benchmark's one-decimal figure (617.49 prints as 617.5, which rounds to 618)."""
    decimals = len(shown.partition(".")[2])
    return {f"{value:.{decimals}f}", f"{float(f'{value:.1f}'):.{decimals}f}"}


def _bench_policy_results() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("_doc_bench_policy", BENCH_POLICY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    traces = {name: make() for name, make in module.all_traces(module.SEED, False).items()}
    return module.run_all(traces, TABLE_POLICIES)  # type: ignore[no-any-return]


def test_the_performance_pages_policy_table_is_what_the_policy_benchmark_gives() -> None:
    table = _policy_table()
    assert set(table) == set(POLICY_ROWS)
    results = _bench_policy_results()
    for label, traces in POLICY_ROWS.items():
        *ratios, waits = table[label]
        for policy, cell in zip(TABLE_POLICIES, ratios, strict=True):
            shown = cell.split(", ")  # one ratio for all the row's traces, or one each
            each = shown * len(traces) if len(shown) == 1 else shown
            for trace, text in zip(traces, each, strict=True):
                outcome = results[trace][policy].outcome
                ratio = outcome.makespan / outcome.packing_bound
                assert text == f"{ratio:.3f}x", f"{label}, {policy}, {trace}: {ratio:.3f}x"
        for segment in waits.split("; "):
            trace, _, figures = segment.rpartition(": ")
            assert trace in traces or (not trace and len(traces) == 1), segment
            numbers = figures.split(" s")[0].split(" / ")
            if len(numbers) == 1:  # "247 s under every policy"
                numbers *= len(TABLE_POLICIES)
            for policy, number in zip(TABLE_POLICIES, numbers, strict=True):
                p99 = results[trace or traces[0]][policy].classes[-1].p99
                assert number in _written_as(p99, number), f"{label}, {policy}: p99 {p99}"
