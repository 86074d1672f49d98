"""Traces with a ``memory`` field: the same vocabulary as ``acquire(memory=)``, checked strictly."""

from __future__ import annotations

import pytest

from hwpool._sim._trace import TraceError, parse_trace

JSONL = """\
{"arrival": 0, "memory": "6GiB", "duration": 1, "name": "embed"}
{"arrival": 1, "memory": 40960, "duration": 2}
{"arrival": 2, "demand": 2, "duration": 3}
{"arrival": 3, "memory": "1.5G", "demand": null, "duration": 3}
"""

CSV = """\
arrival,demand,memory,duration,name
0,,6GiB,1,embed
1,,40960,2,
2,2,,3,
3,,1.5G,3,
"""


@pytest.mark.parametrize(("text", "fmt"), [(JSONL, "jsonl"), (CSV, "csv")])
def test_memory_tasks_in_both_formats(text: str, fmt: str) -> None:
    tasks = parse_trace(text, fmt=fmt)
    assert [t.memory_mib for t in tasks] == [6144, 40960, None, 1536]
    assert [(t.count, t.units) for t in tasks[:2]] == [(1, 0), (1, 0)]
    assert [t.label for t in tasks] == ["6GiB", "40GiB", "2 GPUs", "1536MiB"]
    assert [t.demand for t in tasks] == [None, None, 2, None]
    assert tasks[0].key == (1, 0, 6144) and tasks[2].key[2] == 0


def test_a_csv_with_only_a_memory_column() -> None:
    tasks = parse_trace("arrival,memory,duration\n0,512MiB,1\n", fmt="csv")
    assert tasks[0].memory_mib == 512


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ('{"arrival": 0, "memory": "6 gigs", "duration": 1}', "field memory must be an int of MiB"),
        ('{"arrival": 0, "memory": "6GB", "duration": 1}', "field memory must be an int of MiB"),
        ('{"arrival": 0, "memory": 0, "duration": 1}', "field memory must be between 1 and"),
        ('{"arrival": 0, "memory": -5, "duration": 1}', "field memory must be between 1 and"),
        ('{"arrival": 0, "memory": 1.5, "duration": 1}', "field memory must be an int of MiB"),
        ('{"arrival": 0, "memory": true, "duration": 1}', "field memory must be an int of MiB"),
        ('{"arrival": 0, "memory": [1], "duration": 1}', "field memory must be an int of MiB"),
        ('{"arrival": 0, "memory": "6GiB", "demand": 0.5, "duration": 1}', "not both"),
        ('{"arrival": 0, "duration": 1}', "field 'demand' is missing (or give 'memory')"),
    ],
)
def test_bad_memory_fields_name_the_line(line: str, what: str) -> None:
    text = '{"arrival": 0, "demand": 0.5, "duration": 1}\n' + line + "\n"
    with pytest.raises(TraceError) as info:
        parse_trace(text, fmt="jsonl", origin="t.jsonl")
    assert str(info.value).startswith("t.jsonl: line 2: ")
    assert what in str(info.value)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("arrival,duration\n0,1\n", "line 1: CSV header lacks the 'demand' column (or a 'memory'"),
        ("arrival,memory,duration\n0,-1,1\n", "line 2: field memory must be an int of MiB"),
        ("arrival,memory,duration\n0,0,1\n", "line 2: field memory must be between 1 and"),
        ("arrival,memory,duration\n0,6 GB,1\n", "line 2: field memory must be an int of MiB"),
        ("arrival,memory,duration\n0," + "9" * 40 + ",1\n", "line 2: field memory must be"),
        ("arrival,memory,demand,duration\n0,1G,0.5,1\n", "line 2: give 'demand' or 'memory'"),
        ("arrival,memory,demand,duration\n0,,,1\n", "line 2: field 'demand' is missing"),
    ],
)
def test_bad_memory_csv(text: str, what: str) -> None:
    with pytest.raises(TraceError, match=rf"^trace: {what}".replace("(", r"\(")):
        parse_trace(text, fmt="csv")
