"""A shared counter that hands each caller a distinct integer, 0, 1, 2, ..., across threads.

On a GIL build ``itertools.count.__next__`` is one C call and therefore atomic; a free-threaded
build makes no such promise for it, so there the counter takes a lock.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable

__all__ = ["GIL_ENABLED", "Cursor"]

GIL_ENABLED: bool = getattr(sys, "_is_gil_enabled", lambda: True)()


class Cursor:
    """``cursor.next()`` returns each integer from 0 upwards exactly once, from any thread."""

    __slots__ = ("_lock", "_value", "next")

    def __init__(self, *, locked: bool = not GIL_ENABLED) -> None:
        self._lock = threading.Lock()
        self._value = 0
        self.next: Callable[[], int] = self._locked_next if locked else itertools.count().__next__

    def _locked_next(self) -> int:
        with self._lock:
            value = self._value
            self._value = value + 1
        return value
