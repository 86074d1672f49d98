"""Small text helpers shared by the command's outputs."""

from __future__ import annotations

__all__ = ["one_line", "plural"]


def plural(count: float, noun: str) -> str:
    """``1 task``, ``2 tasks``, ``1.5 CPUs``: the count, then the noun, in the plural unless 1."""
    number = str(count) if isinstance(count, int) else f"{count:g}"
    return f"{number} {noun}" if count == 1 else f"{number} {noun}s"


def one_line(message: str) -> str:
    """``message`` with every character that could break the line escaped (``\\n``, ...):
    a file name may hold a newline, and the error contract is one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)
