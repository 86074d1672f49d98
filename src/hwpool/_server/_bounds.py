"""The range each number in the server's settings may take, past the checks of its type.

A setting's own check (``_config.KEYS``, the command line's types) refuses what is not a
value at all: a negative time, a count of 0. These bounds refuse what is one but cannot be
meant: a timer that never fires (a grace of 30 years), a cap that caps nothing (a million
connections per user), a GPU with an exbibyte of memory, a watcher that samples the GPUs
a thousand times a second. ``hwpool serve`` applies them to a config file's values and to
its flags alike, and refuses to start (exit 2) naming the key and the value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .._wire._protocol import MAX_GPUS

__all__ = [
    "MIN_WATCH_INTERVAL", "MOST", "MOST_GPU_MEMORY", "MOST_LIMIT", "MOST_SHARE", "at_most",
    "bounded", "check_bound",
]  # fmt: skip

T = TypeVar("T")

HOUR, DAY = 3600.0, 86400.0
MOST: dict[str, float] = {
    "gpus": MAX_GPUS,
    "half_life": 366 * DAY,
    "grace": HOUR,
    "hello_timeout": HOUR,
    "idle_timeout": 366 * DAY,
    "watch_interval": HOUR,
    "over_lease_grace": DAY,
    "max_connections": 4096,
    "max_control_connections": 1024,
    "max_requests_per_connection": 1_000_000,
    "max_requests_per_user": 1_000_000,
    "metrics_max_connections": 4096,
    "metrics_timeout": HOUR,
}
"""The most each plain setting may be (seconds, or a count)."""
MOST_GPU_MEMORY = 2**24
"""The most memory one GPU may be said to have, in MiB (16 TiB: a hundred times today's
largest)."""
MOST_SHARE = 1e6
"""The largest fair share: shares are relative, and a million to one is already absolute."""
MOST_LIMIT: dict[str, float] = {"gpus": MAX_GPUS, "running": 1_000_000, "queued": 1_000_000}
"""The most each key of a ``[limits]`` table may be (``memory`` is bounded by its parser)."""
MIN_WATCH_INTERVAL = 0.01
"""The shortest watch interval but 0 (off): sampling NVML or nvidia-smi faster only burns
the server's loop."""


def check_bound(key: str, value: object) -> None:
    """ValueError, saying the bound and ``value``, where setting ``key``'s ``value`` (already
    checked for its type) is past :data:`MOST` (each GPU's, for ``gpu_memory``: past
    :data:`MOST_GPU_MEMORY`), or is a watch interval under :data:`MIN_WATCH_INTERVAL` but 0."""
    if key == "gpu_memory" and isinstance(value, tuple):
        for index, mib in enumerate(value):
            if isinstance(mib, int) and mib > MOST_GPU_MEMORY:
                raise ValueError(
                    f"GPU {index}'s memory must be at most {MOST_GPU_MEMORY} MiB (16 TiB), "
                    f"got {mib} MiB"
                )
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    most = MOST.get(key)
    if most is not None and value > most:
        raise ValueError(f"must be at most {most:.0f}, got {value!r}")
    if key == "watch_interval" and 0 < value < MIN_WATCH_INTERVAL:
        raise ValueError(f"must be 0 (off) or at least {MIN_WATCH_INTERVAL:g} s, got {value!r}")


def bounded(key: str, check: Callable[[object], T]) -> Callable[[object], T]:
    """``check``, then :func:`check_bound` for ``key``."""

    def checked(value: object) -> T:
        result = check(value)
        check_bound(key, result)
        return result

    return checked


def at_most(most: float, check: Callable[[object], T]) -> Callable[[object], T]:
    """``check``, then a ValueError where the number it gives is over ``most``."""

    def checked(value: object) -> T:
        result = check(value)
        if isinstance(result, (int, float)) and not isinstance(result, bool) and result > most:
            raise ValueError(f"must be at most {most:.0f}, got {value!r}")
        return result

    return checked
