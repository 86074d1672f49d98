"""A tiny text progress bar for the CLI (stdlib only, redrawn in place on a terminal).

Built in rather than tqdm or rich: the package has no runtime dependencies, and the demo needs
one line that counts finished tasks; 30 lines do that. On a stream that is not a terminal
(a pipe, a file, a test) the bar draws nothing unless ``force`` is given, so captured output
stays clean. With a ``delay`` it stays hidden until the work has lasted that long, so that a
quick run prints nothing.
"""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """A one-line bar ``[####....] 12/40 label 1.3 s``: :meth:`advance`, then :meth:`close`."""

    def __init__(
        self, total: int, label: str, stream: TextIO, *, force: bool = False, delay: float = 0.0
    ) -> None:
        if total < 1:
            raise ValueError(f"total must be >= 1, got {total}")
        self.total = total
        self.label = label
        self.stream = stream
        self.enabled = force or stream.isatty()
        self.delay = delay
        self.done = 0
        self._started = time.monotonic()
        self._drawn = False

    def render(self, width: int = 30) -> str:
        """The bar as text, without carriage return."""
        filled = width * self.done // self.total
        elapsed = time.monotonic() - self._started
        bar = "#" * filled + "." * (width - filled)
        return f"[{bar}] {self.done}/{self.total} {self.label} {elapsed:.1f} s"

    def advance(self, steps: int = 1) -> None:
        """Count ``steps`` more finished units and redraw."""
        self.done = min(self.total, self.done + steps)
        if self.enabled and time.monotonic() - self._started >= self.delay:
            self._drawn = True
            self.stream.write("\r" + self.render())
            self.stream.flush()

    def close(self) -> None:
        """Finish the line so that later output starts on a fresh one (if anything was drawn)."""
        if self.enabled and (self._drawn or not self.delay):
            self.stream.write("\r" + self.render() + "\n")
            self.stream.flush()
