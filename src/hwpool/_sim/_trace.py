"""Workload traces for the simulator: one task per line, JSON Lines or CSV.

A task has ``arrival`` (seconds, >= 0), ``demand`` and ``duration`` (seconds, > 0), and an
optional ``name``. The demand is one number read by a single rule: a number in (0, 1] is a
fraction of one GPU (``1`` is one whole GPU), an integer >= 2 is a count of whole GPUs; anything
else (0, negatives, 1.5) is an error. Instead of ``demand``, a task may give ``memory``: GPU
memory on one GPU, as the API takes it (a JSON integer of MiB or a string such as ``"6GiB"``; in
CSV, digits alone are MiB). Giving both is an error, as it is in ``acquire()``; an empty CSV
cell or a JSON ``null`` counts as not given. A task may also give ``owner`` (a non-empty string:
a user, a team; default none, one owner for all) and ``priority`` (an integer, higher first
within its owner; default 0), which the hwpool policies schedule by (fair share between
owners; the baselines ignore them), and ``limit`` (seconds, > 0): a time limit enforced as
``hwpool run --time`` enforces it, so a task whose ``duration`` exceeds it ends at the limit,
timed out; the hwpool policies may count on it (backfill onto the head's GPUs). JSON Lines:
one object per line, numbers as JSON numbers (``"0.5"`` is refused, as the API refuses a
string). CSV: a header line naming the columns, in any order. In both, blank lines and lines
starting with ``#`` are skipped, a UTF-8 byte order mark is ignored, and an unknown or repeated
field is an error. What ``hwpool simulate --json`` writes is a trace too (its tasks are read
back; how they ran is ignored).

Parsing is all or nothing: the first bad line raises :class:`TraceError` naming the file, the
line number and the field, before anything is simulated or printed.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .._check import is_ascii_int
from .._core._capacity import UNITS_PER_GPU, fraction_to_units
from .._core._memory import format_mib, parse_memory
from ._names import EXAMPLE_TRACES
from ._rows import TraceError, csv_rows, json_rows, lines, show

__all__ = [
    "EXAMPLE_TRACES",
    "MAX_SECONDS",
    "Task",
    "TraceError",
    "example_trace",
    "load_trace",
    "parse_trace",
]

REQUIRED = ("arrival", "duration")
MAX_SECONDS = 1e12
"""The largest arrival or duration, in seconds (about 31,700 years): it keeps every time and
every sum of times the simulator computes finite and exact to well under a millisecond."""
_CSV_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class Task:
    """One task of a workload: ``count`` GPUs with ``units`` each, for ``duration`` seconds.

    A task that asks for memory has ``memory_mib`` (MiB on one GPU), ``count`` 1 and ``units``
    0: what that is in capacity depends on the machine it runs on.
    """

    name: str
    arrival: float
    count: int
    units: int
    duration: float
    memory_mib: int | None = None
    owner: str | None = None
    priority: int = 0
    limit: float | None = None
    """A time limit (seconds) enforced on the task: it runs ``min(duration, limit)``."""

    @property
    def runtime(self) -> float:
        """How long the task holds its GPUs: its duration, cut at its limit if it has one."""
        limit = self.limit
        return self.duration if limit is None or limit >= self.duration else limit

    @property
    def timed_out(self) -> bool:
        """Whether the task runs past its limit (and so is ended at it)."""
        return self.limit is not None and self.duration > self.limit

    @property
    def demand(self) -> float | int | None:
        """The demand as written in a trace: a fraction of one GPU, or a whole-GPU count >= 2;
        None for a task that asks for memory."""
        if self.memory_mib is not None:
            return None
        return self.count if self.count > 1 else self.units / UNITS_PER_GPU

    @property
    def key(self) -> tuple[int, int, int]:
        """The demand class, as a sortable key: (count, units, memory in MiB or 0)."""
        return self.count, self.units, self.memory_mib or 0

    @property
    def gpu_seconds(self) -> float:
        """The work in this task, in GPU-seconds (0 for a memory task: see the simulator)."""
        return self.count * self.units / UNITS_PER_GPU * self.runtime

    @property
    def label(self) -> str:
        """The demand class this task belongs to, for tables and legends."""
        if self.memory_mib is not None:
            return format_mib(self.memory_mib)
        return f"{self.count} GPUs" if self.count > 1 else f"{self.demand:g} GPU"


def example_trace(name: str) -> str:
    """The text of the bundled example trace ``name`` (a key of :data:`EXAMPLE_TRACES`)."""
    if name not in EXAMPLE_TRACES:
        raise ValueError(f"unknown example trace {name!r}; choose from {sorted(EXAMPLE_TRACES)}")
    return (
        resources.files("hwpool._sim").joinpath("traces", EXAMPLE_TRACES[name]).read_text("utf-8")
    )


def load_trace(source: str, *, max_gpus: int | None = None) -> list[Task]:
    """Read a trace from a file path or, if no such file exists, a bundled example name.

    ``max_gpus``: a task that needs more GPUs is an error naming its line. Raises TraceError
    for a file that is missing, a directory, unreadable or not UTF-8, and for a bad line.
    """
    text = _read_file(source)
    if text is not None:
        return parse_trace(
            text, fmt=_format_of(Path(source), text), origin=source, max_gpus=max_gpus
        )
    if source in EXAMPLE_TRACES:
        text = example_trace(source)
        fmt = _format_of(Path(EXAMPLE_TRACES[source]), text)
        return parse_trace(text, fmt=fmt, origin=source, max_gpus=max_gpus)
    raise TraceError(
        f"trace {source!r}: no such file, and not an example ({', '.join(EXAMPLE_TRACES)})"
    )


def _read_file(source: str) -> str | None:
    """The text of the regular file ``source``; None when there is no such file."""
    try:
        info = os.stat(source)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise TraceError(f"trace {source!r}: cannot read: {_reason(exc)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise TraceError(f"{source}: is a directory; give a trace file (JSON Lines or CSV)")
    if not stat.S_ISREG(info.st_mode):
        raise TraceError(f"{source}: not a regular file")
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise TraceError(f"{source}: cannot read: {_reason(exc)}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{source}: not UTF-8 text (byte {exc.start} is not valid)") from None


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _format_of(path: Path, text: str) -> str:
    """'csv' or 'jsonl', from the extension, else from the first meaningful character."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    first = next((line.strip() for _, line in lines(text.removeprefix("\ufeff"))), "")
    return "jsonl" if first.startswith("{") else "csv"


def parse_trace(
    text: str, *, fmt: str, origin: str = "trace", max_gpus: int | None = None
) -> list[Task]:
    """Parse a whole trace (``fmt`` is 'jsonl' or 'csv'); tasks come back sorted by arrival.

    Ties keep the file order. ``max_gpus``: a task needing more GPUs is an error. Raises
    TraceError naming ``origin``, the line and the field.
    """
    if fmt not in ("jsonl", "csv"):
        raise ValueError(f"fmt must be 'jsonl' or 'csv', got {fmt!r}")
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark, as spreadsheets write
    rows = json_rows(text, origin) if fmt == "jsonl" else csv_rows(text, origin)
    strict = fmt == "jsonl"  # JSON numbers must be numbers; CSV values are all text
    tasks: list[Task] = []
    for index, (where, row) in enumerate(rows, start=1):
        tasks.append(_task(row, where, f"task{index}", strict=strict))
        _check_fits(tasks[-1], where, max_gpus)
    if not tasks:
        raise TraceError(f"{origin}: the trace has no tasks")
    return sorted(tasks, key=lambda task: task.arrival)


def _check_fits(task: Task, where: str, max_gpus: int | None) -> None:
    if max_gpus is not None and task.count > max_gpus:
        raise TraceError(f"{where}: task {task.name!r} needs {task.count} GPUs but gpus={max_gpus}")


def _task(row: Mapping[str, object], where: str, default_name: str, *, strict: bool) -> Task:
    for field in REQUIRED:
        if field not in row or row[field] in ("", None):
            raise TraceError(f"{where}: field {field!r} is missing")
    arrival = _seconds(row["arrival"], "arrival", where, strict)
    duration = _seconds(row["duration"], "duration", where, strict)
    if arrival < 0:
        raise TraceError(f"{where}: field 'arrival' must be >= 0, got {show(row['arrival'])}")
    if duration <= 0:
        raise TraceError(f"{where}: field 'duration' must be > 0, got {show(row['duration'])}")
    name = _name(row.get("name"), where, default_name)
    owner = _owner(row.get("owner"), where)
    priority = _priority(row.get("priority"), where, strict)
    limit = _limit(row.get("limit"), where, strict)
    memory = _memory(row.get("memory"), where, strict)
    demand = row.get("demand")
    if memory is not None:
        if demand not in ("", None):
            raise TraceError(f"{where}: give 'demand' or 'memory', not both")
        return Task(name, arrival, 1, 0, duration, memory, owner, priority, limit)
    if demand in ("", None):
        raise TraceError(f"{where}: field 'demand' is missing (or give 'memory')")
    count, units = _demand(demand, where, strict)
    return Task(name, arrival, count, units, duration, None, owner, priority, limit)


def _limit(value: object, where: str, strict: bool) -> float | None:
    """The task's time limit: seconds, > 0 and at most MAX_SECONDS; None when not given."""
    if value is None or value == "":
        return None
    limit = _seconds(value, "limit", where, strict)
    if limit <= 0:
        raise TraceError(f"{where}: field 'limit' must be > 0 seconds, got {show(value)}")
    return limit


def _owner(value: object, where: str) -> str | None:
    """The task's owner: a non-empty string, or None when not given."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TraceError(f"{where}: field 'owner' must be a string, got {show(value)}")
    return value


_PRIORITY = re.compile(r"[+-]?[0-9]{1,18}")


def _priority(value: object, where: str, strict: bool) -> int:
    """The task's priority: an integer (a JSON integer; in CSV, digits with an optional
    sign) of at most 18 digits; 0 when not given."""
    if value is None or value == "":
        return 0
    if strict and type(value) is int and abs(value) < 10**18:
        return value
    if not strict and isinstance(value, str) and _PRIORITY.fullmatch(value.strip()):
        return int(value.strip())
    raise TraceError(
        f"{where}: field 'priority' must be an integer of at most 18 digits, got {show(value)}"
    )


def _memory(value: object, where: str, strict: bool) -> int | None:
    """MiB from a ``memory`` field: as the API reads it, plus CSV digits as MiB; None if absent."""
    if value is None or value == "":
        return None
    text = value.strip() if isinstance(value, str) else ""
    if not strict and is_ascii_int(text) and len(text) <= 20:
        value = int(text)  # CSV has no numbers, only text: digits alone are MiB
    try:
        return parse_memory(value, "memory")
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{where}: field {exc}") from None


def _name(value: object, where: str, default: str) -> str:
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise TraceError(f"{where}: field 'name' must be a string, got {show(value)}")
    return value


def _seconds(value: object, field: str, where: str, strict: bool) -> float:
    number = _number(value, field, where, strict)
    if abs(number) > MAX_SECONDS:
        raise TraceError(
            f"{where}: field {field!r} must be at most {MAX_SECONDS:g} seconds, got {show(value)}"
        )
    return number


def _number(value: object, field: str, where: str, strict: bool) -> float:
    """A finite number: a JSON number (``strict``) or a decimal CSV string; never a bool."""
    textual = isinstance(value, str) and not strict
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if not (numeric or (textual and _CSV_NUMBER.fullmatch(str(value)))):
        raise TraceError(f"{where}: field {field!r} must be a number, got {show(value)}")
    try:
        number = float(value)  # type: ignore[arg-type]  # int, float or a decimal string
    except OverflowError:  # an int of hundreds of digits
        raise TraceError(f"{where}: field {field!r} is out of range, got {show(value)}") from None
    if not math.isfinite(number):
        raise TraceError(f"{where}: field {field!r} must be finite, got {show(value)}")
    return number


def _demand(value: object, where: str, strict: bool) -> tuple[int, int]:
    """(count, units) from a demand: a fraction in (0, 1] or a whole-GPU count >= 2."""
    number = _number(value, "demand", where, strict)
    if 0 < number <= 1:
        try:
            return 1, fraction_to_units(number, "demand")
        except ValueError as exc:
            raise TraceError(f"{where}: field 'demand': {exc}") from None
    if number >= 2 and number.is_integer():
        return int(number), UNITS_PER_GPU
    raise TraceError(
        f"{where}: field 'demand' must be a fraction in (0, 1] or a whole count >= 2, "
        f"got {show(value)}"
    )
