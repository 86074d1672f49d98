"""Fixed-point GPU capacity: fractions of a GPU as integer units.

Capacities are integers so that sums are exact: ten grants of 0.1 free exactly one GPU.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "UNITS_PER_GPU",
    "check_count",
    "check_timeout",
    "fraction_to_units",
    "units_to_fraction",
]

UNITS_PER_GPU = 1_000_000
"""Capacity units in one whole GPU (a resolution of one millionth of a GPU)."""


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{name} must not be NaN, got {value!r}")
    return number


def fraction_to_units(fraction: object, name: str = "fraction") -> int:
    """Convert a GPU fraction in (0, 1] to integer units, rejecting anything else.

    Raises TypeError for a bool or a non-number, ValueError for NaN, infinities,
    values outside (0, 1] and values too small to represent (under half a unit).
    """
    number = _check_real(name, fraction)
    if not 0.0 < number <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {fraction!r}")
    units = round(number * UNITS_PER_GPU)
    if units < 1:
        raise ValueError(f"{name} must be at least 1/{UNITS_PER_GPU} of a GPU, got {fraction!r}")
    return units


def units_to_fraction(units: int) -> float:
    """Convert integer units back to a fraction of a GPU (for display and snapshots)."""
    return units / UNITS_PER_GPU


def check_count(count: object, num_gpus: int, name: str = "count") -> int:
    """Validate a whole-GPU count: an int in [1, num_gpus]."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {count!r} ({type(count).__name__})")
    value = int(count)
    if not 1 <= value <= num_gpus:
        raise ValueError(f"{name} must be between 1 and num_gpus={num_gpus}, got {value}")
    return value


def check_timeout(timeout: object) -> float | None:
    """Validate a timeout in seconds: None (wait forever) or a finite number >= 0."""
    if timeout is None:
        return None
    number = _check_real("timeout", timeout)
    if not 0.0 <= number < math.inf:
        raise ValueError(f"timeout must be None or a finite number >= 0, got {timeout!r}")
    return number
