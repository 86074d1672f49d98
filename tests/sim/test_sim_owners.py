"""Owners and priorities in traces and the simulator (issue 23): the ``owner`` and
``priority`` columns in both formats, their errors, waits per owner, ``--share``, and the
flood that fair share fixes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hwpool._cli._report import format_table, outcomes_json
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._sim._rows import TraceError
from hwpool._sim._simulate import simulate
from hwpool._sim._trace import Task, parse_trace

CSV = "arrival,demand,duration,owner,priority\n0,1,10,a,\n0,0.5,10,a,-2\n1,2,10,b,+3\n"
JSONL = (
    '{"arrival": 0, "demand": 1, "duration": 10, "owner": "a"}\n'
    '{"arrival": 0, "demand": 0.5, "duration": 10, "owner": "a", "priority": -2}\n'
    '{"arrival": 1, "demand": 2, "duration": 10, "owner": "b", "priority": 3}\n'
)


@pytest.mark.parametrize(("text", "fmt"), [(CSV, "csv"), (JSONL, "jsonl")])
def test_owner_and_priority_columns(text: str, fmt: str) -> None:
    tasks = parse_trace(text, fmt=fmt)
    assert [(t.owner, t.priority) for t in tasks] == [("a", 0), ("a", -2), ("b", 3)]


def test_a_trace_without_owners_has_none() -> None:
    (task,) = parse_trace("arrival,demand,duration\n0,1,1\n", fmt="csv")
    assert (task.owner, task.priority) == (None, 0)


_JSON = '{"arrival": 0, "demand": 1, "duration": 1, '
_INTEGER = "'priority' must be an integer"


@pytest.mark.parametrize(
    ("text", "fmt", "what"),
    [
        (_JSON + '"owner": 7}', "jsonl", "'owner' must be a str"),
        (_JSON + '"priority": 1.5}', "jsonl", _INTEGER),
        (_JSON + '"priority": "1"}', "jsonl", _INTEGER),
        (_JSON + '"priority": true}', "jsonl", _INTEGER),
        (_JSON + '"priority": 1e30}', "jsonl", _INTEGER),
        ("arrival,demand,duration,priority\n0,1,1,high\n", "csv", _INTEGER),
        ("arrival,demand,duration,priority\n0,1,1,1.0\n", "csv", _INTEGER),
        ("arrival,demand,duration,priority\n0,1,1,1" + "0" * 18 + "\n", "csv", "at most 18 digits"),
    ],
)  # fmt: skip
def test_bad_owner_or_priority_names_the_line_and_field(text: str, fmt: str, what: str) -> None:
    with pytest.raises(TraceError, match=what) as info:
        parse_trace(text, fmt=fmt, origin="t")
    assert "line " in str(info.value)


def _flood(b_count: int, b_units: float, owners: bool) -> list[Task]:
    """A queues 200 one-GPU 10 s tasks at once; B one task at t=1 (issue 23's flood)."""
    a, b = ("a", "b") if owners else (None, None)
    tasks = [Task(f"a{i}", 0.0, 1, UNITS_PER_GPU, 10.0, None, a) for i in range(200)]
    units = UNITS_PER_GPU if b_count > 1 else round(b_units * UNITS_PER_GPU)
    tasks.append(Task("b", 1.0, b_count, units, 10.0, None, b))
    return tasks


@pytest.mark.parametrize("policy", ["hwpool", "hwpool-reserve-all"])
@pytest.mark.parametrize(("count", "fraction"), [(4, 1.0), (2, 1.0), (1, 0.25)])
def test_the_flood_delays_another_owner_one_hold_time(
    policy: str, count: int, fraction: float
) -> None:
    def b_wait(owners: bool) -> float:
        outcome = simulate(_flood(count, fraction, owners), 4, policy)
        return next(run.wait for run in outcome.runs if run.task.name == "b")

    assert b_wait(owners=False) == 499.0
    assert b_wait(owners=True) == 9.0


def test_waits_per_owner_in_the_table_and_json() -> None:
    outcome = simulate(parse_trace(CSV, fmt="csv"), 2, "hwpool")
    assert [(s.label, s.count) for s in outcome.owners] == [("a", 2), ("b", 1)]
    table = format_table([outcome])
    assert "owner a x2" in table and "owner b x1" in table
    doc = outcomes_json([outcome])
    assert set(doc["owners"]) == {"a", "b"}  # type: ignore[arg-type, index]
    # What --json writes reads back with its owners and priorities.
    back = parse_trace(json.dumps(doc), fmt="jsonl")
    assert [(t.owner, t.priority) for t in back] == [("a", 0), ("a", -2), ("b", 3)]


def test_one_owner_has_no_per_owner_rows() -> None:
    outcome = simulate(parse_trace("arrival,demand,duration,owner\n0,1,1,a\n", fmt="csv"), 1)
    assert outcome.owners == ()
    assert "owner" not in format_table([outcome])


def test_shares_reach_the_core() -> None:
    # On one GPU x and y each run one task, then each queues one more: the one with the
    # larger share goes first (reserve-all: no head to keep its place).
    text = "arrival,demand,duration,owner\n0,1,10,x\n0,1,10,y\n1,1,10,x\n1,1,10,y\n"
    tasks = parse_trace(text, fmt="csv")
    for favoured in ("x", "y"):
        shares = {favoured: 4.0}
        outcome = simulate(tasks, 1, "hwpool-reserve-all", shares=shares, half_life=100.0)
        later = [run for run in outcome.runs if run.task.arrival == 1.0]
        assert min(later, key=lambda run: run.start).task.owner == favoured


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_share_and_half_life(tmp_path: pytest.TempPathFactory) -> None:
    trace = tmp_path / "t.csv"  # type: ignore[operator]
    trace.write_text(CSV)
    proc = _cli("simulate", str(trace), "--gpus", "2", "--share", "b=2", "--half-life", "60")
    assert proc.returncode == 0, proc.stderr
    assert "owner b x1" in proc.stdout
    for bad in ("b", "=2", "b=0", "b=-1", "b=nan", "b=x"):
        proc = _cli("simulate", str(trace), "--share", bad)
        assert proc.returncode == 2
        assert "--share: must be OWNER=N with N a finite number > 0" in proc.stderr
