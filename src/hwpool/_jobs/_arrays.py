"""Job arrays as Slurm's ``--array`` writes them: ``0-99``, ``1,3,7``, ``0-99:10``, any of
them joined by commas, and ``%K`` at the end for at most K members running at once.

An array is one submit of one command as many jobs, its *members*: each gets its own row
and its own number (as each Slurm array task has its own job id), shares the array's id
(the first member's number, ``j12``), and is shown as ``j12_INDEX``. A member learns its index
from ``HWPOOL_ARRAY_INDEX`` and the array from ``HWPOOL_ARRAY_ID``.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["MAX_ARRAY_INDEX", "MAX_ARRAY_SIZE", "ArraySpec", "parse_array_spec"]

MAX_ARRAY_INDEX = 1_000_000
"""The largest index an array may use (Slurm's ``MaxArraySize`` bounds it likewise)."""
MAX_ARRAY_SIZE = 10_000
"""The most members one array may have: one transaction adds them all."""

_RANGE = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7})(?::([0-9]{1,7}))?)?")
_FORMS = "INDEX, FIRST-LAST or FIRST-LAST:STEP, comma-separated, then %K if you like (0-99%4)"


class ArraySpec(NamedTuple):
    """The indices, in ascending order, each once; ``limit``: at most that many members
    running at once (None: no limit)."""

    indices: tuple[int, ...]
    limit: int | None


def parse_array_spec(text: str, name: str = "--array") -> ArraySpec:
    """The :class:`ArraySpec` written in ``text``; ValueError naming ``name`` and quoting
    the text (or the part of it at fault) otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"{name} must be text such as '0-99%4', got {text!r}")
    ranges, percent, limit_text = text.strip().partition("%")
    limit = None
    if percent:
        if not limit_text.isascii() or not limit_text.isdigit() or int(limit_text) < 1:
            raise ValueError(f"{name}: %K must be an integer >= 1, got {text[:60]!r}")
        limit = int(limit_text)
    found: set[int] = set()
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"{name} must be {_FORMS}; got {part.strip()[:40]!r} in {text[:60]!r}")
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        step = 1 if match[3] is None else int(match[3])
        if last < first or step < 1 or last > MAX_ARRAY_INDEX:
            raise ValueError(
                f"{name}: {part.strip()!r} must run upwards, with a step >= 1, to at most "
                f"{MAX_ARRAY_INDEX}"
            )
        if len(found) + (last - first) // step + 1 > MAX_ARRAY_SIZE:
            raise ValueError(f"{name}: more than {MAX_ARRAY_SIZE} members in {text[:60]!r}")
        found.update(range(first, last + 1, step))
    return ArraySpec(tuple(sorted(found)), limit)
