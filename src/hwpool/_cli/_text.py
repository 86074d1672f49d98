"""Small text helpers shared by the command's outputs."""

from __future__ import annotations

from .._printable import printable

__all__ = ["one_line", "plural", "printable"]


def plural(count: float, noun: str) -> str:
    """``1 task``, ``2 tasks``, ``1.5 CPUs``: the count, then the noun, in the plural unless 1."""
    number = str(count) if isinstance(count, int) else f"{count:g}"
    return f"{number} {noun}" if count == 1 else f"{number} {noun}s"


one_line = printable
"""``message`` with every character that could break the line, or drive the terminal, escaped
(``\\n``, ``\\x1b``, ...): a file name may hold a newline, and the error contract is one line.
The same function as :func:`printable`, under the name the error paths use."""
