"""KeyboardInterrupt injected at the n-th line that runs in chosen files (sys.settrace).

The exception comes out of the traced line as one raised by a signal handler would (only
more often: at every line, not only where CPython checks for signals). A trace function that
raises is unset, so each run injects at most once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import hwpool

CORE_DIR = str(Path(hwpool.__file__).parent / "_core")


class Injection:
    """Counts the line events in files under ``directory``; raises at the ``at``-th."""

    def __init__(self, at: int, directory: str = CORE_DIR) -> None:
        self.at = at
        self.directory = directory
        self.lines = 0
        self.fired = False

    def _local(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                self.fired = True
                raise KeyboardInterrupt(f"injected at line event {self.at}")
        return self._local

    def _global(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename.startswith(self.directory):
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


def every_line(run: Callable[[Injection], None], limit: int = 100_000) -> int:
    """Call ``run`` with an injection at line event 1, 2, ... until one runs to its end with
    none fired; return how many were injected (fails past ``limit``)."""
    for at in range(1, limit):
        injection = Injection(at)
        run(injection)
        if not injection.fired:
            return at - 1
    raise AssertionError(f"still injecting after {limit} line events")
