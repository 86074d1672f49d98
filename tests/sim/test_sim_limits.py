"""Time limits in traces and the simulator (issue 23): the ``limit`` column in both formats, its
errors, a task past its limit ended there (``timed_out``), and the liar that limits tame: a
long task that backfills onto the head's GPU on the strength of its limit ends by it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hwpool._cli._report import format_table, outcomes_json
from hwpool._sim._machine import task_demand
from hwpool._sim._rows import TraceError
from hwpool._sim._simulate import simulate
from hwpool._sim._trace import parse_trace

CSV = "arrival,demand,duration,limit\n0,1,10,\n0,0.5,10,4\n1,2,3,5.5\n"
JSONL = (
    '{"arrival": 0, "demand": 1, "duration": 10}\n'
    '{"arrival": 0, "demand": 0.5, "duration": 10, "limit": 4}\n'
    '{"arrival": 1, "demand": 2, "duration": 3, "limit": 5.5}\n'
)

# A 4-GPU head waits behind a 0.6-GPU task limited to 10 s (its shadow: 10); a quarter-GPU
# "liar" that would hold 1000 s starts in front of it only because its limit (5 s) ends by
# the shadow, and is ended at its limit: the head starts on time.
LIAR = (
    '{"arrival": 0, "demand": 0.6, "duration": 10, "limit": 10, "name": "holder"}\n'
    '{"arrival": 0.5, "demand": 1, "duration": 5, "name": "head"}\n'
    '{"arrival": 1, "demand": 0.25, "duration": 1000, "limit": 5, "name": "liar"}\n'
    '{"arrival": 1, "demand": 0.25, "duration": 1000, "name": "unlimited"}\n'
)


@pytest.mark.parametrize(("text", "fmt"), [(CSV, "csv"), (JSONL, "jsonl")])
def test_the_limit_column(text: str, fmt: str) -> None:
    tasks = parse_trace(text, fmt=fmt)
    assert [t.limit for t in tasks] == [None, 4.0, 5.5]
    assert [t.runtime for t in tasks] == [10.0, 4.0, 3.0]
    assert [t.timed_out for t in tasks] == [False, True, False]
    assert [task_demand(t, None).limit for t in tasks] == [None, 4.0, 5.5]


_JSON = '{"arrival": 0, "demand": 1, "duration": 1, '


@pytest.mark.parametrize(
    ("text", "fmt", "what"),
    [
        (_JSON + '"limit": 0}', "jsonl", "'limit' must be > 0 seconds, got 0"),
        (_JSON + '"limit": -1}', "jsonl", "'limit' must be > 0 seconds, got -1"),
        (_JSON + '"limit": "5"}', "jsonl", "'limit' must be a number"),
        (_JSON + '"limit": true}', "jsonl", "'limit' must be a number"),
        (_JSON + '"limit": 1e13}', "jsonl", "'limit' must be at most"),
        ("arrival,demand,duration,limit\n0,1,1,abc\n", "csv", "'limit' must be a number"),
        ("arrival,demand,duration,limit\n0,1,1,nan\n", "csv", "'limit' must be a number"),
        ("arrival,demand,duration,limit\n0,1,1,0\n", "csv", "'limit' must be > 0 seconds"),
    ],
)  # fmt: skip
def test_a_bad_limit_names_the_line_and_field(text: str, fmt: str, what: str) -> None:
    with pytest.raises(TraceError, match=what) as info:
        parse_trace(text, fmt=fmt, origin="t")
    assert "t: line 2" in str(info.value) or "t: line 1" in str(info.value)


def test_a_task_past_its_limit_ends_at_it_under_every_policy() -> None:
    tasks = parse_trace(JSONL, fmt="jsonl")
    for policy in ("hwpool", "hwpool-reserve-all", "fifo", "first-fit", "shortest-queue"):
        outcome = simulate(tasks, 2, policy)
        limited = next(r for r in outcome.runs if r.task.limit == 4.0)
        assert limited.end - limited.start == 4.0, policy


def test_the_liar_is_ended_at_its_limit_and_the_head_starts_on_time() -> None:
    outcome = simulate(parse_trace(LIAR, fmt="jsonl"), 1, "hwpool")
    runs = {r.task.name: r for r in outcome.runs}
    assert (runs["liar"].start, runs["liar"].end) == (1.0, 6.0)  # backfilled, ended at 5 s
    assert runs["head"].start == 10.0  # when the holder's limit ends: not delayed
    assert runs["unlimited"].start >= runs["head"].end  # no limit: it passes nobody


def test_timed_out_in_the_table_and_json_and_read_back(tmp_path: Path) -> None:
    outcome = simulate(parse_trace(JSONL, fmt="jsonl"), 2, "hwpool")
    assert "tasks ended at their limit       1" in format_table([outcome])
    doc = outcomes_json([outcome])
    tasks = doc["tasks"]  # type: ignore[index]
    assert [t.get("timed_out") for t in tasks] == [None, True, False]  # type: ignore[union-attr]
    assert [t.get("limit") for t in tasks] == [None, 4.0, 5.5]  # type: ignore[union-attr]
    back = parse_trace(json.dumps(doc), fmt="jsonl")  # timed_out is how it ran: ignored
    assert [t.limit for t in back] == [None, 4.0, 5.5]
    path = tmp_path / "t.jsonl"
    path.write_text(JSONL)
    done = subprocess.run(
        [sys.executable, "-m", "hwpool", "simulate", str(path), "--gpus", "2"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tasks ended at their limit" in done.stdout


def test_no_limit_no_row() -> None:
    outcome = simulate(parse_trace("arrival,demand,duration\n0,1,1\n", fmt="csv"), 1)
    assert "limit" not in format_table([outcome])
    assert "timed_out" not in json.dumps(outcomes_json([outcome]))
