"""One rule for showing text that others wrote: every character that is not printable is escaped.

Names, command lines, file names and error messages may come from another user (a job's name
in ``hwpool status``, a client's label in the server's log). Shown raw, an escape sequence
would drive the viewer's terminal, and a newline would forge a line of output. ``printable``
is the one function every command and the server's log pass such text through.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped as Python writes it (``\\n``,
    ``\\x1b``, ``\\u202e``, ``\\ud800``): control characters, line and paragraph separators,
    format characters (bidirectional overrides) and lone surrogates. Printable text, spaces
    included, is returned as it is (the common case costs one scan)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def _escaped(char: str) -> str:
    """The escape of one non-printable character (ASCII only, so it is safe on any terminal)."""
    return char.encode("unicode_escape", "backslashreplace").decode("ascii")
