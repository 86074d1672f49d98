"""GPU memory amounts: what a caller writes (``6144``, ``"6GiB"``, ``"20G"``) as whole MiB.

The rules, strict so that a typo never becomes a silently wrong reservation:

- an ``int`` (any ``numbers.Integral`` but ``bool``) is a number of MiB, >= 1;
- a string is a number and a unit: ASCII digits with an optional decimal part (``"1.5GiB"``),
  optional spaces, then one of ``MiB``, ``GiB``, ``TiB`` or the short forms ``M``, ``G``, ``T``,
  case as written here. Every unit is binary: ``"20G"`` is 20 GiB (20,480 MiB), as in
  ``docker --memory`` and ``nvidia-smi``'s MiB figures. ``"GB"``/``"MB"`` are refused, since
  they mean powers of ten to some and powers of two to others; so is a bare ``"512"`` (say the
  unit) and anything else (``"6 gigs"``, ``"-1GiB"``, ``"1e3MiB"``);
- a fractional amount is rounded *up* to whole MiB (``"0.1GiB"`` is 103 MiB), so that what is
  admitted is never less than what was asked;
- the amount is at least 1 MiB and at most :data:`MAX_MIB` (1 EiB);
- anything else (a float, ``None``, ``bool``) is a TypeError: a float of MiB has no meaning a
  caller would want, and NaN or infinity are never amounts.

TypeError for a wrong type, ValueError for a wrong value, both naming the argument and value.
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction

from .._check import check_int

__all__ = ["MAX_MIB", "UNIT_MIB", "format_mib", "parse_memory"]

UNIT_MIB = {"MiB": 1, "M": 1, "GiB": 1024, "G": 1024, "TiB": 1024**2, "T": 1024**2}
"""MiB in one of each accepted unit (all binary)."""

MAX_MIB = 1024**4
"""The largest amount accepted, in MiB (1 EiB): far past any device, small enough to be exact."""

_AMOUNT = re.compile(r"\s*([0-9]{1,16}(?:\.[0-9]{1,16})?)\s*([A-Za-z]+)\s*")
_EXAMPLES = "an int of MiB or a string such as '6GiB', '512MiB', '20G' or '1.5GiB'"


def parse_memory(value: object, name: str = "memory") -> int:
    """``value`` (an int of MiB or a string with a unit; see the module docstring) in MiB."""
    if isinstance(value, str):
        return _parse_text(value, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {_EXAMPLES}, got {value!r} ({type(value).__name__})")
    return check_int(name, value, minimum=1, maximum=MAX_MIB)


def _parse_text(text: str, name: str) -> int:
    match = _AMOUNT.fullmatch(text)
    if match is None or match.group(2) not in UNIT_MIB:
        units = ", ".join(UNIT_MIB)
        raise ValueError(f"{name} must be {_EXAMPLES} (units: {units}), got {text!r}")
    mib = math.ceil(Fraction(match.group(1)) * UNIT_MIB[match.group(2)])
    if not 1 <= mib <= MAX_MIB:
        raise ValueError(f"{name} must be between 1 MiB and {MAX_MIB} MiB, got {text!r}")
    return mib


def format_mib(mib: int) -> str:
    """``mib`` in the largest unit that writes it exactly: ``"80GiB"``, ``"81559MiB"``;
    ``"0MiB"`` for nothing (not ``"0TiB"``).

    :func:`parse_memory` reads it back to ``mib`` exactly (for ``mib`` >= 1, what it accepts).
    """
    if mib == 0:
        return "0MiB"
    for unit in ("TiB", "GiB"):
        if mib % UNIT_MIB[unit] == 0:
            return f"{mib // UNIT_MIB[unit]}{unit}"
    return f"{mib}MiB"
