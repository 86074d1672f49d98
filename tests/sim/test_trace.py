"""Trace parsing: both formats, the demand rule, and errors that name the line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwpool._cli._report import outcomes_json
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._sim._simulate import simulate
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
    ('{"arrival": NaN, "demand": 0.5, "duration": 1}', "line 2", "'arrival' must be finite"),
    ('{"arrival": 0, "demand": 0.5, "duration": Infinity}', "line 2", "'duration' must be finite"),
    ('{"arrival": 0, "demand": "0.5", "duration": 1}', "line 2", "'demand' must be a number"),
    ('{"arrival": "0", "demand": 0.5, "duration": 1}', "line 2", "'arrival' must be a number"),
    ('{"arrival": 0, "demand": 0.5, "duration": 1, "name": 7}', "line 2", "'name' must be a str"),
    ('{"arrival": 0, "demand": 0.5, "duration": 1, "arrival": 2}', "line 2", "'arrival' appears"),
    ('{"arrival": 1e300, "demand": 0.5, "duration": 1}', "line 2", "'arrival' must be at most"),
    ('{"arrival": 0, "demand": 0.5, "duration": 2e12}', "line 2", "'duration' must be at most"),
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


def test_a_directory_is_not_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="is a directory") as info:
        load_trace(str(tmp_path))
    assert "no such file" not in str(info.value)


def test_a_file_that_is_not_utf8_says_so(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"arrival,demand,duration,name\n0,0.5,1,caf\xe9\n")
    with pytest.raises(TraceError, match=r"latin1\.csv: not UTF-8 text"):
        load_trace(str(path))


@pytest.mark.parametrize("suffix", [".csv", ".txt"])
def test_a_utf8_byte_order_mark_is_ignored(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"excel{suffix}"
    path.write_bytes("arrival,demand,duration\r\n0,0.5,1\r\n".encode("utf-8-sig"))
    (task,) = load_trace(str(path))
    assert (task.arrival, task.units, task.duration) == (0.0, UNITS_PER_GPU // 2, 1.0)
    (same,) = parse_trace("\ufeff" + JSONL.splitlines()[2], fmt="jsonl")
    assert same.name == "late"


def test_unknown_and_duplicate_csv_columns_are_errors_at_the_header() -> None:
    # Unknown fields were already refused in JSON Lines (and on the first CSV row); a repeated
    # CSV column or JSON key used to keep its last value silently.
    with pytest.raises(TraceError, match=r"t.csv: line 1: unknown column 'gpu' in the CSV header"):
        parse_trace("arrival,demand,duration,gpu\n0,0.5,1,3\n", fmt="csv", origin="t.csv")
    with pytest.raises(TraceError, match=r"line 1: column 'demand' appears twice"):
        parse_trace("arrival,demand,duration,demand\n0,0.5,1,2\n", fmt="csv")
    with pytest.raises(TraceError, match=r"line 1: unknown column ''"):
        parse_trace("arrival,demand,duration,\n0,0.5,1,\n", fmt="csv")  # a trailing comma


def test_a_task_wider_than_the_machine_names_the_file_and_line() -> None:
    text = "arrival,demand,duration,name\n0,0.5,1,a\n1,3,1,wide\n"
    with pytest.raises(TraceError) as info:
        parse_trace(text, fmt="csv", origin="t.csv", max_gpus=2)
    assert str(info.value) == "t.csv: line 3: task 'wide' needs 3 GPUs but gpus=2"
    assert len(parse_trace(text, fmt="csv", max_gpus=3)) == 2


# ----------------------------------------------------------------- inputs that used to crash
def test_a_400_digit_integer_is_an_error_not_an_overflow() -> None:
    # json.loads reads it as an int, and float() of it raised OverflowError (a traceback).
    huge = "1" * 400
    with pytest.raises(TraceError, match=r"t: line 1: field 'arrival' is out of range, got 1111"):
        parse_trace(f'{{"arrival": {huge}, "demand": 0.5, "duration": 1}}', fmt="jsonl", origin="t")
    with pytest.raises(TraceError, match=r"line 2: field 'arrival' must be finite"):
        parse_trace(f"arrival,demand,duration\n{huge},0.5,1\n", fmt="csv")
    longer = "1" * 5000  # past the interpreter's int-to-text digit limit
    with pytest.raises(TraceError, match=r"line 1: field 'duration'"):
        parse_trace(f'{{"arrival": 0, "demand": 0.5, "duration": {longer}}}', fmt="jsonl")


def test_a_name_nested_deeper_than_the_recursion_limit_is_an_error() -> None:
    depth = 100_000
    line = '{"arrival": 0, "demand": 0.5, "duration": 1, "name": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(TraceError, match=r"t: line 1: not valid JSON \(nested too deeply\)"):
        parse_trace(line, fmt="jsonl", origin="t")


def test_a_name_holding_a_line_separator_is_read_whole() -> None:
    # str.splitlines() splits at U+2028 and U+2029, which JSON strings may hold raw.
    text = '{"arrival": 0, "demand": 0.5, "duration": 1, "name": "a\u2028b\u2029c\x85d"}\n'
    (task,) = parse_trace(text, fmt="jsonl")
    assert task.name == "a\u2028b\u2029c\x85d"
    (row,) = parse_trace("arrival,demand,duration,name\n0,0.5,1,a\u2028b\n", fmt="csv")
    assert row.name == "a\u2028b"


def test_a_csv_field_over_the_csv_limit_is_an_error_naming_the_line() -> None:
    text = "arrival,demand,duration,name\n0,0.5,1,a\n1,0.5,1," + "x" * 200_000 + "\n"
    with pytest.raises(TraceError, match=r"t.csv: line 3: not valid CSV \(field larger than"):
        parse_trace(text, fmt="csv", origin="t.csv")


# ----------------------------------------------------------------- the tool's own --json output
def test_simulate_json_output_reads_back_as_the_same_tasks() -> None:
    tasks = load_trace("batch")
    single = json.dumps(outcomes_json([simulate(tasks, 4)]), indent=1)
    several = json.dumps(outcomes_json([simulate(tasks, 4), simulate(tasks, 4, "fifo")]))
    for text in (single, several):
        back = parse_trace(text, fmt="jsonl", origin="out.json")
        assert back == tasks


def test_a_json_document_that_is_not_simulate_output_says_what_is_expected() -> None:
    with pytest.raises(TraceError, match=r"write one task object per line"):
        parse_trace('{\n "tasks": 3\n}\n', fmt="jsonl")
    with pytest.raises(TraceError, match=r"d: line 3: not valid JSON"):
        parse_trace('{\n "tasks": [\n oops\n}\n', fmt="jsonl", origin="d")
    doc = {"tasks": [{"arrival": 0, "demand": "2", "duration": 1, "start": 0, "gpus": [0, 1]}]}
    with pytest.raises(TraceError, match=r"d: tasks\[0\]: field 'demand' must be a number"):
        parse_trace(json.dumps(doc), fmt="jsonl", origin="d")


@pytest.mark.parametrize("name", sorted(EXAMPLE_TRACES))
def test_examples_load_and_are_packaged(name: str) -> None:
    tasks = load_trace(name)
    assert len(tasks) > 50
    assert all(t.duration > 0 for t in tasks)


def test_batch_example_has_two_gpu_jobs() -> None:
    assert any(t.count == 2 for t in load_trace("batch"))
    assert all(t.count == 1 for t in load_trace("embedding"))
