"""Trace text to rows: JSON Lines, a JSON document (``hwpool simulate --json``), or CSV.

Each reader yields ``(where, row)``: ``where`` locates the row for error messages (``file: line
N``, or ``file: tasks[i]`` inside a document) and ``row`` maps field names to raw values (JSON
values, or CSV strings). The readers check the shape of the text only (valid JSON, one object
per line, a CSV header, no duplicate or unknown field); what the values mean is checked by the
caller. Lines are split on ``\\n`` alone: ``str.splitlines`` also splits on U+2028 and other
separators that JSON strings may hold raw.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator, Mapping

__all__ = ["FIELDS", "RESULT_FIELDS", "Row", "TraceError", "csv_rows", "json_rows", "lines", "show"]

FIELDS = ("arrival", "demand", "duration", "name", "memory", "owner", "priority", "limit")
RESULT_FIELDS = ("start", "end", "wait", "gpus", "timed_out")
"""Fields of ``simulate --json`` tasks that say how a task ran; ignored when it is read back."""

Row = tuple[str, Mapping[str, object]]


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the field."""


def lines(text: str) -> Iterator[tuple[int, str]]:
    """``(number, line)`` of the lines worth reading: not blank, not a ``#`` comment."""
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield number, line


def json_rows(text: str, origin: str) -> Iterator[Row]:
    """Rows of JSON Lines, or of the ``tasks`` of one JSON document written by ``--json``."""
    numbered = list(lines(text))
    if numbered and _is_document(numbered[0][1]):
        yield from _document_rows(text, origin)
        return
    for number, line in numbered:
        row = _loads(line, f"{origin}: line {number}")
        if not isinstance(row, dict):
            raise TraceError(f"{origin}: line {number}: expected a JSON object, got {show(line)}")
        _check_fields(row, f"{origin}: line {number}")
        yield f"{origin}: line {number}", row


def _is_document(first: str) -> bool:
    """Whether the first line opens a whole JSON document rather than one task per line."""
    try:
        row = _loads(first, "")
    except TraceError:
        return first.strip() == "{"  # the first line of an indented document
    return isinstance(row, dict) and ("tasks" in row or "policies" in row)


def _document_rows(text: str, origin: str) -> Iterator[Row]:
    """The tasks of a ``simulate --json`` document (with several policies: the first one's)."""
    doc = _loads(text, origin, whole=True)
    if isinstance(doc, dict) and isinstance(doc.get("policies"), dict) and doc["policies"]:
        name, doc = next(iter(doc["policies"].items()))
        prefix = f"{origin}: policies.{name}."
    else:
        prefix = f"{origin}: "
    tasks = doc.get("tasks") if isinstance(doc, dict) else None
    if not isinstance(tasks, list):
        raise TraceError(
            f"{origin}: a JSON document must be what `hwpool simulate --json` writes, with a "
            "'tasks' list; otherwise write one task object per line (JSON Lines)"
        )
    for index, task in enumerate(tasks):
        where = f"{prefix}tasks[{index}]"
        if not isinstance(task, dict):
            raise TraceError(f"{where}: expected a JSON object, got {show(task)}")
        row = {key: value for key, value in task.items() if key not in RESULT_FIELDS}
        _check_fields(row, where)
        yield where, row


def _loads(text: str, where: str, *, whole: bool = False) -> object:
    """``json.loads`` with every failure (syntax, depth, duplicate keys) as a TraceError.

    ``whole``: ``text`` is a whole file, so a syntax error's line is added to ``where``.
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_json_int)
    except RecursionError:
        raise TraceError(f"{where}: not valid JSON (nested too deeply)") from None
    except _DuplicateKeyError as exc:
        raise TraceError(f"{where}: field {show(exc.args[0])} appears twice") from None
    except json.JSONDecodeError as exc:
        at = f": line {exc.lineno}" if whole else ""
        raise TraceError(f"{where}{at}: not valid JSON ({exc.msg})") from None
    except ValueError as exc:  # the few errors json.loads lets through as they are
        raise TraceError(f"{where}: not valid JSON ({exc})") from None


class _DuplicateKeyError(Exception):
    """A JSON object names a key twice (json.loads would silently keep the last)."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    row: dict[str, object] = {}
    for key, value in pairs:
        if key in row:
            raise _DuplicateKeyError(key)
        row[key] = value
    return row


def _json_int(digits: str) -> int | float:
    """A JSON integer; one past the interpreter's digit limit for ``int()`` becomes a float
    (an infinite one), so that the range check refuses it naming its field."""
    limit = sys.get_int_max_str_digits()
    return int(digits) if limit == 0 or len(digits) <= limit else float(digits)


def _check_fields(row: Mapping[str, object], where: str) -> None:
    unknown = [field for field in row if field not in FIELDS]
    if unknown:
        raise TraceError(f"{where}: unknown field {show(unknown[0])} (fields: {', '.join(FIELDS)})")


def csv_rows(text: str, origin: str) -> Iterator[Row]:
    """Rows of a CSV trace: a header naming each field once, in any order, then one per line."""
    numbered = lines(text)
    first = next(numbered, None)
    if first is None:
        return
    columns = [column.strip() for column in _csv_fields(first, origin)]
    _check_columns(columns, f"{origin}: line {first[0]}")
    for number, line in numbered:
        values = _csv_fields((number, line), origin)
        if len(values) != len(columns):
            raise TraceError(
                f"{origin}: line {number}: expected {len(columns)} fields, got {len(values)}"
            )
        yield (
            f"{origin}: line {number}",
            dict(zip(columns, (v.strip() for v in values), strict=True)),
        )


def _csv_fields(numbered: tuple[int, str], origin: str) -> list[str]:
    number, line = numbered
    try:
        return next(csv.reader([line]))
    except csv.Error as exc:  # a field over csv.field_size_limit(), for one
        raise TraceError(f"{origin}: line {number}: not valid CSV ({exc})") from None


def _check_columns(columns: list[str], where: str) -> None:
    """Unknown and duplicate columns are errors, as unknown and duplicate JSON fields are."""
    for index, column in enumerate(columns):
        if column not in FIELDS:
            raise TraceError(
                f"{where}: unknown column {show(column)} in the CSV header "
                f"(columns: {', '.join(FIELDS)})"
            )
        if column in columns[:index]:
            raise TraceError(f"{where}: column {column!r} appears twice in the CSV header")
    for field in ("arrival", "duration"):
        if field not in columns:
            raise TraceError(f"{where}: CSV header lacks the {field!r} column")
    if "demand" not in columns and "memory" not in columns:
        raise TraceError(f"{where}: CSV header lacks the 'demand' column (or a 'memory' one)")


def show(value: object, limit: int = 60) -> str:
    """``repr(value)``, shortened for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
