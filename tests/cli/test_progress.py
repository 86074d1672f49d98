"""The built-in progress bar."""

from __future__ import annotations

import io

import pytest

from hwpool._cli._progress import ProgressBar


def test_bar_redraws_in_place_and_ends_the_line() -> None:
    stream = io.StringIO()
    bar = ProgressBar(4, "calls", stream, force=True)
    bar.advance()
    bar.advance(2)
    bar.close()
    text = stream.getvalue()
    assert text.count("\r") == 3
    assert "[#######.......................] 1/4 calls" in text
    assert text.endswith("\n")
    assert "[" + "#" * 22 + "." * 8 + "] 3/4 calls" in text.splitlines()[-1]


def test_bar_is_silent_on_a_non_terminal() -> None:
    stream = io.StringIO()
    bar = ProgressBar(3, "x", stream)
    bar.advance(5)
    bar.close()
    assert stream.getvalue() == ""
    assert bar.done == 3  # clamped to the total


def test_bar_needs_a_total() -> None:
    with pytest.raises(ValueError, match="total must be >= 1, got 0"):
        ProgressBar(0, "x", io.StringIO())
