"""The table and the JSON documents of schedules."""

from __future__ import annotations

import json

from hwpool._cli._report import format_table, outcome_json, outcomes_json
from hwpool._sim._simulate import simulate
from hwpool._sim._trace import parse_trace

TRACE = "arrival,demand,duration,name\n0,0.5,2,a\n0,2,1,b\n1,0.5,1,c\n"


def test_table_columns_line_up() -> None:
    tasks = parse_trace(TRACE, fmt="csv")
    table = format_table([simulate(tasks, 2), simulate(tasks, 2, "shortest-queue")])
    lines = table.splitlines()
    assert lines[0].split() == ["hwpool", "shortest-queue"]
    assert len({len(line) for line in lines if line.split()[-1][0].isdigit()}) == 1
    assert "0.5 GPU x2" in table
    assert "2 GPUs x1" in table


def test_json_is_plain_and_round_trips() -> None:
    tasks = parse_trace(TRACE, fmt="csv")
    one = simulate(tasks, 2)
    doc = json.loads(json.dumps(outcome_json(one)))
    # a runs 0-2 on GPU 0; b reserves both GPUs, runs 2-3; c (arriving at 1) runs 3-4.
    assert doc["makespan"] == one.makespan == 4.0
    assert doc["waits"]["2 GPUs"] == {"count": 1, "p50": 2.0, "p99": 2.0, "max": 2.0}
    assert [(t["name"], t["start"]) for t in doc["tasks"]] == [("a", 0), ("b", 2), ("c", 3)]
    both = outcomes_json([one, simulate(tasks, 2, "fifo")])
    assert set(both) == {"gpus", "lower_bound", "packing_bound", "policies"}
    assert outcomes_json([one]) == outcome_json(one)
