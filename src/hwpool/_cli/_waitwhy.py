"""Why a request waits and when it should start, in words, for every command that shows the
queue (``hwpool status``, ``top``, ``run``'s waiting line, ``jobs``): one way of saying it.

The server sends a waiter's ``reason`` (``priority``, ``resources``, ``reserved``,
``owner-limit``, ``held``, ``draining``, ``dependency``), a detail and an estimated start on
the wall clock, or None where nothing bounds the wait (see docs/scheduling.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .._printable import printable

__all__ = ["estimate_words", "span", "wait_words"]


def estimate_words(start: float | None, now: float | None = None) -> str:
    """``starts in about 12 min (14:03)``, ``should start now`` or ``start unknown``."""
    if start is None:
        return "start unknown"
    at = time.time() if now is None else now
    left = start - at
    if left < 1:
        return "should start now"
    clock = time.strftime("%H:%M:%S", time.localtime(start))
    return f"starts in about {span(left)} ({clock})"


def wait_words(waiter: Mapping[str, Any], now: float | None = None, *, detail: bool = True) -> str:
    """``priority: 2 waiting ahead ...; starts in about 3 min (14:03:12)`` for a waiter's
    record (a status report's or the wire's); "" from a server that sends no reason."""
    reason = waiter.get("reason")
    if not reason:
        return ""
    said = printable(str(reason))
    why = waiter.get("reason_detail")
    if detail and why:
        said += f": {printable(str(why))}"
    return f"{said}; {estimate_words(waiter.get('estimated_start'), now)}"


def span(seconds: float) -> str:
    """``4.2 s``, ``12 min``, ``3.5 h``: short and about right."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
