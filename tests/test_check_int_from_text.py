"""``int_from_text``: integers written on a command line, bounded before they are converted."""

from __future__ import annotations

import pytest

from hwpool._check import int_from_text


def test_accepts_ascii_digits_within_the_bounds() -> None:
    assert int_from_text("--gpus", "8", minimum=1, maximum=4096) == 8
    assert int_from_text("--gpus", " 0004096 ", minimum=1, maximum=4096) == 4096
    assert int_from_text("n", "12345678901234567890") == 12345678901234567890


@pytest.mark.parametrize("text", ["", "two", "-1", "+3", "1.0", "²", "٣", "1_000"])
def test_refuses_what_is_not_ascii_digits(text: str) -> None:
    with pytest.raises(ValueError, match=r"--gpus must be an integer between 1 and 4096, got"):
        int_from_text("--gpus", text, minimum=1, maximum=4096)


@pytest.mark.parametrize("text", ["0", "4097", "99999999999999999999", "9" * 100_000])
def test_refuses_what_is_out_of_bounds_without_converting_huge_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="between 1 and 4096") as info:
        int_from_text("--gpus", text, minimum=1, maximum=4096)
    assert len(str(info.value)) < 100  # the message quotes a shortened value


def test_minimum_only() -> None:
    with pytest.raises(ValueError, match="n must be an integer >= 2, got 1"):
        int_from_text("n", "1", minimum=2)
    with pytest.raises(ValueError, match=r"n must be an integer >= 2, got '99999.*\.\.\.'"):
        int_from_text("n", "9" * 100_000, minimum=2)  # beyond int()'s digit limit
