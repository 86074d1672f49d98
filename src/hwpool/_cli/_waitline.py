"""The one status line ``hwpool run`` shows on a terminal while it waits in the queue.

A thread redraws it in place (carriage return, erase to the end of the line) a few times a
second, and asks the server where this process's request stands about once a second, over the
connection the request itself went through (a queued job needs one connection, not two): its
position in the queue, how many wait, the GPUs it reserves, and why it waits and when it
should start, as the server says.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TextIO

from .._wire._protocol import StatusReply
from ._waitwhy import wait_words

__all__ = ["WaitLine"]

REDRAW_S = 0.25
ASK_EVERY = 4  # redraws between two questions to the server


class WaitLine:
    """Shows ``hwpool run: waiting 3 s for 0.5 of a GPU: 2nd of 3 in the queue`` on ``out``."""

    def __init__(self, out: TextIO, what: str, status: Callable[[], StatusReply]) -> None:
        self._out = out
        self._what = what
        self._status = status
        self._since = time.monotonic()
        self._where = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hwpool-run-line", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop redrawing and erase the line."""
        self._stop.set()
        self._thread.join(5.0)
        with contextlib.suppress(OSError, ValueError):
            self._out.write("\r\x1b[K")
            self._out.flush()

    def _run(self) -> None:
        turn = 0
        while not self._stop.is_set():
            if turn % ASK_EVERY == 0 or not self._where:  # each turn until it is queued
                self._ask()
            turn += 1
            self._draw()
            self._stop.wait(REDRAW_S)

    def _ask(self) -> None:
        try:
            reply = self._status()
        except (ConnectionError, OSError, TimeoutError):  # shown again once the server answers
            return
        self._where = where_in_queue(reply, os.getpid())

    def _draw(self) -> None:
        waited = time.monotonic() - self._since
        line = f"hwpool run: waiting {waited:.0f} s for {self._what}{self._where}"
        with contextlib.suppress(OSError, ValueError):
            self._out.write("\r" + line + "\x1b[K")
            self._out.flush()


def where_in_queue(reply: StatusReply, pid: int) -> str:
    """``: 2nd of 3 in the queue, reserves GPU 1 (resources; starts in about 3 min
    (14:03:12))`` for the first waiter of ``pid``."""
    for position, waiter in enumerate(reply.waiting, 1):
        if waiter.pid == pid:
            reserve = ""
            if waiter.reserved:
                reserve = f", reserves GPU {','.join(map(str, waiter.reserved))}"
            recovering = ", server recovering" if reply.recovering_s else ""
            why = wait_words(
                {"reason": waiter.reason, "estimated_start": waiter.estimated_start},
                detail=False,
            )
            return (
                f": {_ordinal(position)} of {len(reply.waiting)} in the queue{reserve}{recovering}"
                + (f" ({why})" if why else "")
            )
    return ""


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
