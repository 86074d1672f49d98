"""Fixed-point GPU capacity: fractions of a GPU as integer units.

Capacities are integers so that sums are exact. ``UNITS_PER_GPU`` is 2**6 * 3**2 * 5**6 * 7,
so that the fractions people write are whole numbers of units: halves to tenths, twelfths,
sixteenths, hundredths and every multiple of a millionth. Three leases of ``Fraction(1, 3)``
fill a GPU exactly, and so do ten of ``0.1``.

A demand is rounded *up* to whole units, so that demands which together exceed a GPU never
share one (a GPU holds ten leases of ``Fraction(1, 11)``, not eleven: 11 does not divide
``UNITS_PER_GPU``). A float is taken as the whole unit it is within float noise of (``0.1``
is 0.1000000000000000055...: that noise is not a demand); exact numbers (``int``,
``fractions.Fraction``) are rounded up exactly.
"""

from __future__ import annotations

import math
import numbers

from .._check import check_real

__all__ = ["UNITS_PER_GPU", "fraction_to_units", "units_to_fraction"]

UNITS_PER_GPU = 63_000_000
"""Capacity units in one whole GPU (2**6 * 3**2 * 5**6 * 7)."""

_FLOAT_NOISE = 1e-6
"""Units: a float within this of a whole unit is that unit (its error is under 1e-7 units)."""


def fraction_to_units(fraction: object, name: str = "fraction") -> int:
    """Convert a GPU fraction in (0, 1] to integer units, rounded up (at least one unit).

    Accepts what the numeric tower calls Real (``float``, ``int``, ``Fraction``, NumPy
    numbers), but not ``bool`` and not ``Decimal`` (the tower does not count it as Real):
    TypeError for those and for non-numbers, ValueError for NaN, infinities and values
    outside (0, 1].
    """
    number = check_real(name, fraction)
    if not 0.0 < number <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {fraction!r}")
    if isinstance(fraction, numbers.Integral):
        return UNITS_PER_GPU  # only 1 is in range
    if isinstance(fraction, numbers.Rational):
        numerator, denominator = int(fraction.numerator), int(fraction.denominator)
        return -(-numerator * UNITS_PER_GPU // denominator)
    return max(1, math.ceil(number * UNITS_PER_GPU - _FLOAT_NOISE))


def units_to_fraction(units: int) -> float:
    """Convert integer units back to a fraction of a GPU (for display and snapshots)."""
    return units / UNITS_PER_GPU
