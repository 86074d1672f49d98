"""KeyboardInterrupt injected at the n-th line that runs in chosen files (sys.settrace).

The exception comes out of the traced line as one raised by a signal handler would (only
more often: at every line, not only where CPython checks for signals). A trace function that
raises is unset, so each run injects at most once. A line event back at a ``with`` statement
(its exit) is not counted: raised there, before ``__exit__`` runs, the exception would leave
a lock held, where no signal can land (CPython checks for them after the call to __exit__).
"""

from __future__ import annotations

import linecache
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import hwpool

PACKAGE = Path(hwpool.__file__).parent
CORE = (str(PACKAGE / "_core"),)
LOCAL_BACKEND = (str(PACKAGE / "_core"), str(PACKAGE / "_backends" / "_local.py"))


class Injection:
    """Counts the line events in files whose path starts with one of ``where``; raises
    KeyboardInterrupt at the ``at``-th; ``place`` says where it did (file name, line)."""

    def __init__(self, at: int, where: tuple[str, ...] = CORE) -> None:
        self.at = at
        self.where = where
        self.lines = 0
        self.fired = False
        self.place = ("", 0)
        self._last: dict[FrameType, int] = {}

    def _local(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line" and not self._with_exit(frame):
            self.lines += 1
            if self.lines == self.at:
                self.fired = True
                self.place = (Path(frame.f_code.co_filename).name, frame.f_lineno)
                raise KeyboardInterrupt(f"injected at line event {self.at}")
        return self._local

    def _with_exit(self, frame: FrameType) -> bool:
        line = frame.f_lineno
        back = line <= self._last.get(frame, 0)
        self._last[frame] = line
        return back and linecache.getline(frame.f_code.co_filename, line).lstrip().startswith(
            "with "
        )

    def _global(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename.startswith(self.where):
            return self._local
        return None

    @contextmanager
    def active(self) -> Iterator[None]:
        """Trace this thread inside the block."""
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(None)


def every_line(
    run: Callable[[Injection], None], where: tuple[str, ...] = CORE, limit: int = 100_000
) -> int:
    """Call ``run`` with an injection at line event 1, 2, ... until one runs to its end with
    none fired; return how many were injected (fails past ``limit``)."""
    for at in range(1, limit):
        injection = Injection(at, where)
        run(injection)
        if not injection.fired:
            return at - 1
    raise AssertionError(f"still injecting after {limit} line events")
