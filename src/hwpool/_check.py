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

__all__ = [
    "check_bool",
    "check_callable",
    "check_int",
    "check_real",
    "check_timeout",
    "duration_from_text",
    "env_int",
    "int_from_text",
    "is_ascii_int",
]

_ASCII_DIGITS = re.compile(r"[0-9]+")
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def _type_name(value: object) -> str:
    return type(value).__name__


def check_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    maximum_name: str | None = None,
) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (each bound optional).

    Accepts ``numbers.Integral`` but not ``bool``; TypeError for other types, ValueError
    for a value outside the bounds. ``maximum_name`` names where the maximum comes from
    (``"num_gpus"`` gives "between 1 and num_gpus=4").
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({_type_name(value)})")
    number = int(value)
    top = f"{maximum_name}={maximum}" if maximum_name else f"{maximum}"
    if minimum is not None and number < minimum:
        bound = f"between {minimum} and {top}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be {bound}, got {number}")
    if maximum is not None and number > maximum:
        bound = f"between {minimum} and {top}" if minimum is not None else f"<= {top}"
        raise ValueError(f"{name} must be {bound}, got {number}")
    return number


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False``; TypeError for anything else (``0``, ``"yes"``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({_type_name(value)})")
    return value


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


def int_from_text(name: str, text: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """The integer written in ``text`` (a command-line option, say) within the bounds.

    Only ASCII digits are accepted, as for :func:`env_int`; a number too long to be within
    ``maximum`` is refused before it is converted, so 10,000 digits cost nothing. ValueError
    names ``name`` and the text.
    """
    bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
    digits = text.strip()
    too_long = maximum is not None and len(digits.lstrip("0")) > len(str(maximum))
    try:
        if too_long or not _ASCII_DIGITS.fullmatch(digits):
            raise ValueError
        number = int(digits)  # ValueError past sys.get_int_max_str_digits()
    except ValueError:
        raise ValueError(f"{name} must be an integer {bound}, got {_shorten(text)!r}") from None
    if number < minimum or (maximum is not None and number > maximum):
        raise ValueError(f"{name} must be an integer {bound}, got {number}")
    return number


def _shorten(text: str, limit: int = 40) -> str:
    """``text``, cut to ``limit`` characters with an ellipsis, for an error message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_ascii_int(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits and nothing else (``str.isdigit`` also
    accepts ``²`` and other scripts' digits, which ``int()`` then rejects or reads)."""
    return _ASCII_DIGITS.fullmatch(text) is not None


def check_callable(name: str, value: object) -> None:
    """Raise TypeError naming ``name`` and the value unless ``value`` is callable."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {value!r} ({_type_name(value)})")


def duration_from_text(text: str) -> float:
    """The seconds of a duration written as a number and an optional unit (``ms``, ``s``,
    ``m``, ``h``, ``d``; none: seconds), such as ``"90s"``, ``"30m"``, ``"2h"`` or ``"45"``;
    finite and > 0. ValueError quoting ``text`` otherwise (the caller names the option or
    key: this is shared by ``hwpool serve``'s config file and ``hwpool run --time``)."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(
            f'must be a duration: a number and one of ms, s, m, h, d (like "90s", "1h"), '
            f"got {text[:40]!r}"
        )
    seconds = float(match[1]) * _UNIT_SECONDS[match[2]]
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"must be a duration > 0, got {text[:40]!r}")
    return seconds
