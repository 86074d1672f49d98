"""Small text helpers shared by the command's outputs."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: float, noun: str) -> str:
    """``1 task``, ``2 tasks``, ``1.5 CPUs``: the count, then the noun, in the plural unless 1."""
    number = str(count) if isinstance(count, int) else f"{count:g}"
    return f"{number} {noun}" if count == 1 else f"{number} {noun}s"
