"""Trace parsing: both formats, the demand rule, and errors that name the line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._sim._trace import EXAMPLE_TRACES, TraceError, load_trace, parse_trace

JSONL = """\
# a comment, then a blank line

{"arrival": 2, "demand": 0.25, "duration": 1.5, "name": "late"}
{"arrival": 0, "demand": 2, "duration": 3}
{"arrival": 0, "demand": 1, "duration": 1, "name": "whole"}
"""

CSV = """\
name,duration,arrival,demand
late,1.5,2,0.25
,3,0,2
whole,1,0,1.0
"""


@pytest.mark.parametrize(("text", "fmt"), [(JSONL, "jsonl"), (CSV, "csv")])
def test_both_formats_give_the_same_tasks_sorted_by_arrival(text: str, fmt: str) -> None:
    tasks = parse_trace(text, fmt=fmt)
    assert [t.arrival for t in tasks] == [0.0, 0.0, 2.0]
    assert [(t.count, t.units) for t in tasks] == [
        (2, UNITS_PER_GPU),
        (1, UNITS_PER_GPU),
        (1, UNITS_PER_GPU // 4),
    ]
    assert [t.duration for t in tasks] == [3.0, 1.0, 1.5]
    assert tasks[1].name == "whole"
    assert tasks[2].name == "late"
    assert tasks[0].name.startswith("task")  # unnamed: named after its line


def test_demand_rule_and_labels() -> None:
    tasks = parse_trace(JSONL, fmt="jsonl")
    assert [t.demand for t in tasks] == [2, 1.0, 0.25]
    assert [t.label for t in tasks] == ["2 GPUs", "1 GPU", "0.25 GPU"]
    assert tasks[0].gpu_seconds == 6.0


BAD_LINES = [
    ('{"arrival": 0, "demand": 0.5}', "line 2", "'duration' is missing"),
    ('{"arrival": -1, "demand": 0.5, "duration": 1}', "line 2", "'arrival'"),
    ('{"arrival": 0, "demand": 1.5, "duration": 1}', "line 2", "'demand'"),
    ('{"arrival": 0, "demand": 0, "duration": 1}', "line 2", "'demand'"),
    ('{"arrival": 0, "demand": "x", "duration": 1}', "line 2", "'demand' must be a number"),
    ('{"arrival": 0, "demand": true, "duration": 1}', "line 2", "'demand' must be a number"),
    ('{"arrival": 0, "demand": 0.5, "duration": 0}', "line 2", "'duration' must be > 0"),
    ('{"arrival": "nan", "demand": 0.5, "duration": 1}', "line 2", "'arrival' must be finite"),
    ('{"arrival": 0, "demand": 0.5, "duration": 1, "gpu": 3}', "line 2", "unknown field 'gpu'"),
    ('{"arrival": 0, "demand": 0.5,', "line 2", "not valid JSON"),
    ("[1, 2, 3]", "line 2", "expected a JSON object"),
]


@pytest.mark.parametrize(("line", "where", "what"), BAD_LINES)
def test_bad_jsonl_line_names_line_and_field(line: str, where: str, what: str) -> None:
    text = '{"arrival": 0, "demand": 0.5, "duration": 1}\n' + line + "\n"
    with pytest.raises(TraceError) as info:
        parse_trace(text, fmt="jsonl", origin="t.jsonl")
    assert f"t.jsonl: {where}:" in str(info.value)
    assert what in str(info.value)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("arrival,demand\n0,0.5\n", "line 1: CSV header lacks the 'duration' column"),
        ("arrival,demand,duration\n0,0.5,1\n1,0.5\n", "line 3: expected 3 fields, got 2"),
        ("arrival,demand,duration\n0,0.5,1\n1,abc,1\n", "line 3: field 'demand'"),
        ("arrival,demand,duration\n0,0.5,\n", "line 2: field 'duration' is missing"),
        ("# nothing\n", "the trace has no tasks"),
    ],
)
def test_bad_csv(text: str, what: str) -> None:
    with pytest.raises(TraceError, match=what):
        parse_trace(text, fmt="csv")


def test_bad_format_name() -> None:
    with pytest.raises(ValueError, match="fmt must be"):
        parse_trace(JSONL, fmt="yaml")


def test_load_trace_sniffs_format_without_extension(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(JSONL)
    assert len(load_trace(str(path))) == 3
    path.write_text(CSV)
    assert len(load_trace(str(path))) == 3


def test_load_trace_missing_file_names_it() -> None:
    with pytest.raises(TraceError, match=r"no-such\.csv"):
        load_trace("no-such.csv")


@pytest.mark.parametrize("name", sorted(EXAMPLE_TRACES))
def test_examples_load_and_are_packaged(name: str) -> None:
    tasks = load_trace(name)
    assert len(tasks) > 50
    assert all(t.duration > 0 for t in tasks)


def test_batch_example_has_two_gpu_jobs() -> None:
    assert any(t.count == 2 for t in load_trace("batch"))
    assert all(t.count == 1 for t in load_trace("embedding"))
