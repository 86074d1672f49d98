"""The built-in progress bar."""

from __future__ import annotations

import io

import pytest

from hwpool._cli import _tools
from hwpool._cli._progress import ProgressBar
from hwpool._sim._trace import load_trace


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


def test_a_delayed_bar_stays_hidden_while_the_work_is_quick() -> None:
    stream = io.StringIO()
    bar = ProgressBar(3, "x", stream, force=True, delay=3600)
    bar.advance(3)
    bar.close()
    assert stream.getvalue() == ""


def test_simulate_shows_progress_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(_tools, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr("sys.stderr", terminal)
    tasks = load_trace("embedding")
    _tools.simulate_all(tasks, 4, ["hwpool", "fifo"])
    drawn = terminal.getvalue()
    assert drawn.count("\r") > 10  # redrawn as the simulation goes
    total = 2 * len(tasks)
    assert drawn.endswith(f"] {total}/{total} tasks simulated {drawn.split()[-2]} s\n")
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    _tools.simulate_all(tasks, 4, ["hwpool"])
    assert pipe.getvalue() == ""
