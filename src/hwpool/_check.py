"""Argument and environment checks, in one place, so that every module agrees.

The rule: a wrong type raises TypeError, a wrong value raises ValueError, and both name the
argument (or environment variable) and the value. ``bool`` is never accepted as a number,
though Python counts it as an ``int``; anything the numeric tower calls ``Integral`` (``int``,
``numpy.int64``) is an integer, anything it calls ``Real`` (plus those) is a real number.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

__all__ = ["check_callable", "check_int", "check_real", "check_timeout", "env_int", "is_ascii_int"]

_ASCII_DIGITS = re.compile(r"[0-9]+")


def _type_name(value: object) -> str:
    return type(value).__name__


def check_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (each bound optional).

    Accepts ``numbers.Integral`` but not ``bool``; TypeError for other types, ValueError
    for a value outside the bounds.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({_type_name(value)})")
    number = int(value)
    if minimum is not None and number < minimum:
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {number}")
    if maximum is not None and number > maximum:
        bound = f"between {minimum} and {maximum}" if minimum is not None else f"<= {maximum}"
        raise ValueError(f"{name} must be {bound}, got {number}")
    return number


def check_real(name: str, value: object) -> float:
    """``value`` as a float: any ``numbers.Real`` but ``bool``, and never NaN.

    TypeError for other types (``Decimal`` included: the numeric tower does not count it as
    Real), ValueError for NaN. Infinities pass; callers bound the range they accept.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({_type_name(value)})")
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{name} must not be NaN, got {value!r}")
    return number


def check_timeout(timeout: object, name: str = "timeout") -> float | None:
    """A timeout in seconds: None (wait forever) or a finite real number >= 0."""
    if timeout is None:
        return None
    number = check_real(name, timeout)
    if not 0.0 <= number < math.inf:
        raise ValueError(f"{name} must be None or a finite number >= 0, got {timeout!r}")
    return number


def env_int(name: str, environ: Mapping[str, str], *, minimum: int = 0) -> int | None:
    """The integer in environment variable ``name``, or None when it is unset.

    Only ASCII digits are accepted (no sign, spaces or other scripts' digits such as ``²``);
    anything else, or a value below ``minimum``, raises ValueError naming the variable.
    """
    raw = environ.get(name)
    if raw is None:
        return None
    if not is_ascii_int(raw) or int(raw) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return int(raw)


def is_ascii_int(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits and nothing else (``str.isdigit`` also
    accepts ``²`` and other scripts' digits, which ``int()`` then rejects or reads)."""
    return _ASCII_DIGITS.fullmatch(text) is not None


def check_callable(name: str, value: object) -> None:
    """Raise TypeError naming ``name`` and the value unless ``value`` is callable."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {value!r} ({_type_name(value)})")
