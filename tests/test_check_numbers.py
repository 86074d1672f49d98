"""check_int and check_real: the plain int (and float) fast path keeps the contract."""

from __future__ import annotations

import enum
import math
from fractions import Fraction

import pytest

from hwpool._check import check_int, check_real


class Level(enum.IntEnum):
    HIGH = 3


def test_a_plain_int_within_the_bounds_is_returned_as_it_is() -> None:
    assert check_int("n", 5, minimum=0, maximum=5) == 5
    assert check_int("n", -7) == -7


@pytest.mark.parametrize(
    ("value", "bounds", "error", "message"),
    [
        (True, {}, TypeError, "n must be an int, got True (bool)"),
        (2.0, {}, TypeError, "n must be an int, got 2.0 (float)"),
        (-1, {"minimum": 0}, ValueError, "n must be >= 0, got -1"),
        (9, {"minimum": 0, "maximum": 8}, ValueError, "n must be between 0 and 8, got 9"),
        (9, {"maximum": 8, "maximum_name": "gpus"}, ValueError, "n must be <= gpus=8, got 9"),
    ],
)
def test_what_the_fast_path_lets_through_is_still_refused_by_name(
    value: object, bounds: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        check_int("n", value, **bounds)  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_an_integral_that_is_not_an_int_is_still_taken_as_an_int() -> None:
    number = check_int("n", Level.HIGH, maximum=3)
    assert number == 3 and type(number) is int


def test_check_real_returns_a_float_and_refuses_nan_and_bool() -> None:
    assert check_real("x", 1.5) == 1.5
    assert check_real("x", math.inf) == math.inf
    assert check_real("x", Fraction(1, 4)) == 0.25
    with pytest.raises(ValueError, match="x must not be NaN"):
        check_real("x", math.nan)
    with pytest.raises(TypeError, match="x must be a real number, got False"):
        check_real("x", False)
