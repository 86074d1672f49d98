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
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
# A bare number (seconds) or numbers with units, each unit at most once, largest first:
# "90", "90s", "1h30m", "1d12h", "1.5h", "250ms".
_DURATION = re.compile(
    rf"(?:{_NUMBER}|(?:{_NUMBER}\s*d\s*)?(?:{_NUMBER}\s*h\s*)?(?:{_NUMBER}\s*m(?!s)\s*)?"
    rf"(?:{_NUMBER}\s*s\s*)?(?:{_NUMBER}\s*ms)?)"
)
_UNIT_SECONDS = (1.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)
# Slurm's clock forms: D-HH, D-HH:MM, D-HH:MM:SS, MM:SS, HH:MM:SS (later fields bounded).
_CLOCK = re.compile(
    r"(?:(\d+)-(\d{1,2})(?::(\d{1,2})(?::(\d{1,2}))?)?|(\d+):(\d{1,2})(?::(\d{1,2}))?)"
)
_DURATION_FORMS = (
    'a number of seconds ("90"), units d, h, m, s, ms largest first ("90s", "30m", "1h30m", '
    '"1d"), or MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS'
)


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
    if (
        type(value) is int
        and (minimum is None or value >= minimum)
        and (maximum is None or value <= maximum)
    ):
        return value  # the common case, without the numeric tower's (slow) isinstance
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
    if type(value) is float and not math.isnan(value):  # the common case
        return value
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
    """The seconds of a duration: a bare number (seconds, as hwpool has always read it, where
    Slurm would read minutes), numbers with units largest first (``"90s"``, ``"30m"``,
    ``"1h30m"``, ``"2h"``, ``"1d"``, ``"250ms"``), or one of Slurm's clock forms (``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``, where the fields after the first are
    below 60, or 24 for hours after a day); finite and > 0. ValueError quoting ``text``
    otherwise (the caller names the option or key: this is shared by ``hwpool serve``'s config
    file, ``run``/``submit --time`` and ``wait --timeout``)."""
    stripped = text.strip()
    seconds = _clock_seconds(stripped) if ":" in stripped or "-" in stripped else None
    if seconds is None:
        match = _DURATION.fullmatch(stripped) if len(stripped) <= 64 else None
        if match is None or not stripped:
            raise ValueError(f"must be a duration: {_DURATION_FORMS}; got {_shorten(text)!r}")
        seconds = sum(
            float(part) * unit
            for part, unit in zip(match.groups(), _UNIT_SECONDS, strict=True)
            if part is not None
        )
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"must be a duration > 0, got {_shorten(text)!r}")
    return seconds


def _clock_seconds(text: str) -> float:
    """Seconds of one of Slurm's clock forms; ValueError (naming the forms) otherwise."""
    match = _CLOCK.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        raise ValueError(f"must be a duration: {_DURATION_FORMS}; got {_shorten(text)!r}")
    days, day_hours, day_minutes, day_seconds, first, second, third = match.groups()
    if days is not None:
        fields = [(day_hours, 24, 3600), (day_minutes, 60, 60), (day_seconds, 60, 1)]
        seconds = int(days) * 86400.0
    elif third is None:  # MM:SS
        fields = [(second, 60, 1)]
        seconds = int(first) * 60.0
    else:  # HH:MM:SS
        fields = [(second, 60, 60), (third, 60, 1)]
        seconds = int(first) * 3600.0
    for field, bound, unit in fields:
        if field is None:
            continue
        if int(field) >= bound:
            raise ValueError(
                f"must be a duration with each field after the first below its bound "
                f"(hours < 24 after a day, minutes and seconds < 60), got {_shorten(text)!r}"
            )
        seconds += int(field) * unit
    return seconds
