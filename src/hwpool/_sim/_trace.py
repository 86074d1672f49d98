"""Workload traces for the simulator: one task per line, JSON Lines or CSV.

A task has ``arrival`` (seconds, >= 0), ``demand`` and ``duration`` (seconds, > 0), and an
optional ``name``. The demand is one number read by a single rule: a number in (0, 1] is a
fraction of one GPU (``1`` is one whole GPU), an integer >= 2 is a count of whole GPUs; anything
else (0, negatives, 1.5) is an error. JSON Lines: one object per line. CSV: a header line naming
the columns, in any order. In both, blank lines and lines starting with ``#`` are skipped.

Parsing is all or nothing: the first bad line raises :class:`TraceError` naming the line number
and the field, before anything is simulated or printed.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .._core._capacity import UNITS_PER_GPU, fraction_to_units

__all__ = ["EXAMPLE_TRACES", "Task", "TraceError", "example_trace", "load_trace", "parse_trace"]

FIELDS = ("arrival", "demand", "duration", "name")
REQUIRED = FIELDS[:3]
EXAMPLE_TRACES = {"embedding": "embedding-service.jsonl", "batch": "bursty-batch.csv"}
"""Bundled example traces: short name -> file under ``hwpool/traces``."""


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line and the field."""


@dataclass(frozen=True, slots=True)
class Task:
    """One task of a workload: ``count`` GPUs with ``units`` each, for ``duration`` seconds."""

    name: str
    arrival: float
    count: int
    units: int
    duration: float

    @property
    def demand(self) -> float | int:
        """The demand as written in a trace: a fraction of one GPU, or a whole-GPU count >= 2."""
        return self.count if self.count > 1 else self.units / UNITS_PER_GPU

    @property
    def gpu_seconds(self) -> float:
        """The work in this task, in GPU-seconds."""
        return self.count * self.units / UNITS_PER_GPU * self.duration

    @property
    def label(self) -> str:
        """The demand class this task belongs to, for tables and legends."""
        return f"{self.count} GPUs" if self.count > 1 else f"{self.demand:g} GPU"


def example_trace(name: str) -> str:
    """The text of the bundled example trace ``name`` (a key of :data:`EXAMPLE_TRACES`)."""
    if name not in EXAMPLE_TRACES:
        raise ValueError(f"unknown example trace {name!r}; choose from {sorted(EXAMPLE_TRACES)}")
    return (
        resources.files("hwpool._sim").joinpath("traces", EXAMPLE_TRACES[name]).read_text("utf-8")
    )


def load_trace(source: str) -> list[Task]:
    """Read a trace from a file path or, if no such file exists, a bundled example name.

    Raises TraceError for a missing file or a malformed line.
    """
    path = Path(source)
    if path.is_file():
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceError(f"{source}: cannot read: {exc}") from None
        return parse_trace(text, fmt=_format_of(path, text), origin=source)
    if source in EXAMPLE_TRACES:
        text = example_trace(source)
        return parse_trace(text, fmt=_format_of(Path(EXAMPLE_TRACES[source]), text), origin=source)
    raise TraceError(
        f"trace {source!r}: no such file, and not an example ({', '.join(EXAMPLE_TRACES)})"
    )


def _format_of(path: Path, text: str) -> str:
    """'csv' or 'jsonl', from the extension, else from the first meaningful character."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    first = next((line.strip() for line in text.splitlines() if _meaningful(line)), "")
    return "jsonl" if first.startswith("{") else "csv"


def _meaningful(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def parse_trace(text: str, *, fmt: str, origin: str = "trace") -> list[Task]:
    """Parse a whole trace (``fmt`` is 'jsonl' or 'csv'); tasks come back sorted by arrival.

    Ties keep the file order. Raises TraceError naming ``origin``, the line and the field.
    """
    if fmt == "jsonl":
        rows = _jsonl_rows(text, origin)
    elif fmt == "csv":
        rows = _csv_rows(text, origin)
    else:
        raise ValueError(f"fmt must be 'jsonl' or 'csv', got {fmt!r}")
    tasks = [_task(row, lineno, origin) for lineno, row in rows]
    if not tasks:
        raise TraceError(f"{origin}: the trace has no tasks")
    return sorted(tasks, key=lambda task: task.arrival)


def _jsonl_rows(text: str, origin: str) -> Iterator[tuple[int, Mapping[str, object]]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not _meaningful(line):
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{origin}: line {lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise TraceError(f"{origin}: line {lineno}: expected a JSON object, got {line!r}")
        yield lineno, row


def _csv_rows(text: str, origin: str) -> Iterator[tuple[int, Mapping[str, object]]]:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if _meaningful(line)]
    if not lines:
        return
    header_line, header = lines[0]
    columns = [c.strip() for c in next(csv.reader(io.StringIO(header)))]
    for field in REQUIRED:
        if field not in columns:
            raise TraceError(f"{origin}: line {header_line}: CSV header lacks the {field!r} column")
    for lineno, line in lines[1:]:
        values = next(csv.reader(io.StringIO(line)))
        if len(values) != len(columns):
            raise TraceError(
                f"{origin}: line {lineno}: expected {len(columns)} fields, got {len(values)}"
            )
        yield lineno, dict(zip(columns, (v.strip() for v in values), strict=True))


def _task(row: Mapping[str, object], lineno: int, origin: str) -> Task:
    where = f"{origin}: line {lineno}"
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise TraceError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    for field in REQUIRED:
        if field not in row or row[field] in ("", None):
            raise TraceError(f"{where}: field {field!r} is missing")
    arrival = _number(row["arrival"], "arrival", where)
    duration = _number(row["duration"], "duration", where)
    if arrival < 0:
        raise TraceError(f"{where}: field 'arrival' must be >= 0, got {row['arrival']!r}")
    if duration <= 0:
        raise TraceError(f"{where}: field 'duration' must be > 0, got {row['duration']!r}")
    count, units = _demand(row["demand"], where)
    name = row.get("name")
    label = f"task{lineno}" if name in (None, "") else str(name)
    return Task(label, arrival, count, units, duration)


def _number(value: object, field: str, where: str) -> float:
    """A finite number from a JSON number or a CSV string; bools and text are errors."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TraceError(f"{where}: field {field!r} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise TraceError(f"{where}: field {field!r} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise TraceError(f"{where}: field {field!r} must be finite, got {value!r}")
    return number


def _demand(value: object, where: str) -> tuple[int, int]:
    """(count, units) from a demand: a fraction in (0, 1] or a whole-GPU count >= 2."""
    number = _number(value, "demand", where)
    if 0 < number <= 1:
        try:
            return 1, fraction_to_units(number, "demand")
        except ValueError as exc:
            raise TraceError(f"{where}: field 'demand': {exc}") from None
    if number >= 2 and number.is_integer():
        return int(number), UNITS_PER_GPU
    raise TraceError(
        f"{where}: field 'demand' must be a fraction in (0, 1] or a whole count >= 2, got {value!r}"
    )
