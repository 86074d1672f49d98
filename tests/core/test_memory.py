"""Memory amounts: the unit rules, the bad inputs, and round trips through format_mib."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwpool._core._memory import MAX_MIB, UNIT_MIB, format_mib, parse_memory


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        (1, 1),
        (6144, 6144),
        (np.int64(512), 512),
        ("6GiB", 6144),
        ("512MiB", 512),
        ("20G", 20480),  # G is GiB: every unit is binary
        ("512M", 512),
        ("1T", 1024**2),
        ("2TiB", 2 * 1024**2),
        ("1.5GiB", 1536),
        ("0.1GiB", 103),  # 102.4 MiB, rounded up
        ("1.5MiB", 2),
        ("  6 GiB ", 6144),
        ("80GiB", 81920),
        ("007GiB", 7168),
    ],
)
def test_accepted_amounts(value: object, mib: int) -> None:
    assert parse_memory(value) == mib
    assert type(parse_memory(value)) is int


@pytest.mark.parametrize(
    "text",
    [
        "6 gigs",
        "6GB",  # decimal or binary? refused rather than guessed
        "512MB",
        "6gib",
        "6g",
        "512",  # say the unit
        "",
        "GiB",
        "-1GiB",
        "+1GiB",
        "1e3MiB",
        "1,5GiB",
        ".5GiB",
        "5.GiB",
        "6GiB6",
        "6 Gi B",
        "NaNGiB",
        "infGiB",
        "٣GiB",
        "²GiB",
    ],
)
def test_malformed_strings_are_value_errors_naming_the_argument(text: str) -> None:
    shown = re.escape(repr(text))
    with pytest.raises(ValueError, match=rf"^memory must be an int of MiB .*got {shown}$"):
        parse_memory(text)


@pytest.mark.parametrize("text", ["0GiB", "0MiB", "0.0G", "1048577TiB"])
def test_out_of_range_strings(text: str) -> None:
    with pytest.raises(ValueError, match=rf"must be between 1 MiB and {MAX_MIB} MiB, got '"):
        parse_memory(text)


@pytest.mark.parametrize("value", [0, -1, np.int64(-5), MAX_MIB + 1])
def test_out_of_range_ints(value: object) -> None:
    with pytest.raises(ValueError, match=r"^gpu_memory\[1\] must be between 1 and"):
        parse_memory(value, "gpu_memory[1]")


@pytest.mark.parametrize(
    "value", [True, False, 1.5, 1024.0, math.nan, math.inf, None, Decimal(1), Fraction(1), b"6GiB"]
)
def test_wrong_types(value: object) -> None:
    with pytest.raises(TypeError, match=r"^memory must be an int of MiB or a string"):
        parse_memory(value)


def test_the_error_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"^acquire\(memory=\) must be"):
        parse_memory("6 gigs", "acquire(memory=)")


@given(st.integers(1, MAX_MIB))
def test_format_round_trips(mib: int) -> None:
    text = format_mib(mib)
    assert parse_memory(text) == mib
    assert parse_memory(f"{mib}MiB") == parse_memory(f"{mib}M") == mib == parse_memory(mib)


def test_nothing_is_written_in_mib_not_as_zero_tib() -> None:
    # Before: "0TiB" (0 is a multiple of every unit), as in `hwpool status` of a full GPU.
    assert format_mib(0) == "0MiB"
    assert (format_mib(1), format_mib(1024), format_mib(1024**2)) == ("1MiB", "1GiB", "1TiB")


@given(st.integers(1, 1024**3), st.sampled_from(["GiB", "G", "TiB", "T"]))
def test_whole_units_scale_exactly(amount: int, unit: str) -> None:
    mib = amount * UNIT_MIB[unit]
    if mib <= MAX_MIB:
        assert parse_memory(f"{amount}{unit}") == mib


@given(st.integers(0, 10**6), st.integers(0, 999), st.sampled_from(list(UNIT_MIB)))
def test_decimals_round_up_to_whole_mib(whole: int, thousandths: int, unit: str) -> None:
    exact = Fraction(whole * 1000 + thousandths, 1000) * UNIT_MIB[unit]
    text = f"{whole}.{thousandths:03d}{unit}"
    if exact > 0:
        mib = parse_memory(text)
        assert mib == math.ceil(exact) and mib - 1 < exact <= mib
