"""``hwpool top``: the host server's GPUs, leases and queue, live in the terminal.

A thin shell around :func:`_top_view.render`: it asks the server for its status once per
``--interval`` (one control connection, kept; opened again after the server went away) and
draws the lines. On a terminal it is full-screen (curses), redrawn in place, ``q`` quits and
a resize redraws at once; when stdout is not a terminal, or with ``--once``, it prints one
snapshot per interval (or one, and exits). Exit status as ``hwpool status``: 2 for bad usage,
1 when no server answers (at start: later, the screen says so and it keeps trying), 0 when
quit.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._wire._connection import Wire
from ._host_access import guarded, socket_of
from ._status_report import report_of
from ._text import one_line
from ._top_view import render

if TYPE_CHECKING:
    import curses

__all__ = ["cmd_top"]

QUIT_KEYS = (ord("q"), ord("Q"))
PLAIN_WIDTH = 100  # columns of the plain print when neither the terminal nor COLUMNS says


class Source:
    """The server's status as :func:`report_of` gives it, over one kept control connection."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.path = socket_of(args)
        self.wire: Wire | None = None

    def report(self) -> dict[str, Any]:
        """The status now; ConnectionError (the connection dropped) if the server is gone."""
        if self.wire is None:
            self.wire = Wire(self.path, role="control")
        try:
            return report_of(self.wire, self.wire.status())
        except ConnectionError:
            self.close()
            raise

    def close(self) -> None:
        if self.wire is not None:
            self.wire.shutdown()
            self.wire = None


def _cmd_top(args: argparse.Namespace) -> int:
    source = Source(args)
    try:
        first = source.report()  # no server at all: the one-line error, exit 1
        if args.once or not sys.stdout.isatty():
            return _plain(source, first, args.interval, args.once)
        return _full_screen(source, first, args.interval)
    finally:
        source.close()


def _plain(source: Source, report: dict[str, Any], interval: float, once: bool) -> int:
    """One snapshot per ``interval`` (``once``: one), each ended by a blank line."""
    width = _plain_width()
    while True:
        print("\n".join(render(report, width, None, _note(report, ""))), end="\n\n", flush=True)
        if once:
            return 0
        time.sleep(interval)
        report = _retry(source, report)


def _plain_width() -> int:
    return shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns


def _retry(source: Source, last: dict[str, Any]) -> dict[str, Any]:
    """The next report; the last one, marked with why, while the server does not answer."""
    try:
        return source.report()
    except ConnectionError as exc:
        return {**last, "top_error": one_line(str(exc))}


def _full_screen(source: Source, first: dict[str, Any], interval: float) -> int:
    import curses  # noqa: PLC0415  (only here: plain prints and the parser never need it)

    def run(screen: curses.window) -> int:
        return _screen_loop(screen, source, first, interval)

    return curses.wrapper(run)


def _screen_loop(
    screen: curses.window, source: Source, report: dict[str, Any], interval: float
) -> int:
    """Draw, wait up to ``interval`` for a key, fetch again; ``q`` ends it, a resize (or any
    other key) redraws at once."""
    import curses  # noqa: PLC0415

    _hide_cursor(curses.curs_set)
    screen.timeout(max(1, int(interval * 1000)))
    next_fetch = time.monotonic() + interval
    while True:
        _draw(screen, report)
        key = screen.getch()
        if key in QUIT_KEYS:
            return 0
        if key == curses.KEY_RESIZE:
            curses.update_lines_cols()
        if key == -1 or time.monotonic() >= next_fetch:
            report = _retry(source, report)
            next_fetch = time.monotonic() + interval


def _draw(screen: curses.window, report: dict[str, Any]) -> None:
    """The report's lines, clipped to the window (the last column is left empty: curses
    cannot write the bottom-right cell)."""
    import curses  # noqa: PLC0415

    height, width = screen.getmaxyx()
    note = _note(report, "q quits")
    screen.erase()
    for row, line in enumerate(render(report, max(width - 1, 1), height, note)):
        try:
            screen.addnstr(row, 0, line, max(width - 1, 1))
        except curses.error:  # a window shrunk under us: the next draw fits it
            break
    screen.refresh()


def _note(report: dict[str, Any], keys: str) -> str:
    """What ends the header: the keys, and why the report shown is not fresh, if it is not."""
    error = report.get("top_error")
    if error is None:
        return f"({keys})" if keys else ""
    said = f"no answer now, showing the last one: {error}"
    return f"({keys}; {said})" if keys else f"({said})"


def _hide_cursor(curs_set: Callable[[int], object]) -> None:
    """Hide the cursor where the terminal can (some cannot: that is fine)."""
    try:
        curs_set(0)
    except Exception:  # curses.error, on a terminal without the capability
        return


cmd_top = guarded(_cmd_top)
