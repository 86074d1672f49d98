"""The ``HWPOOL_*`` variables, checked before a command does any work.

The library parts the command drives read six variables, ``hwpool run`` two of its own
(``HWPOOL_AUTOSTART``, ``HWPOOL_RECONNECT_TIMEOUT``, parsed here), and the job commands two
(``HWPOOL_JOBS_KEEP``, ``HWPOOL_JOBS_KEEP_COUNT``, ``HWPOOL_JOBS_LOG_MAX``,
``HWPOOL_NOTIFY_TIMEOUT``). Each is parsed by the library's own parser
(so the command and the library can never disagree) before anything runs: a malformed
``HWPOOL_SPIN`` must stop ``hwpool demo`` at once, not after its GPU stage, when the CPU pool
first reads it. A parser's module is imported only when its variable is set: the check runs
before every command, and most commands need none of those modules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

__all__ = [
    "AUTOSTART_VAR",
    "CHECKED",
    "RECONNECT_VAR",
    "autostart_from_env",
    "check_environment",
    "reconnect_timeout_from_env",
    "seconds_from_text",
]

AUTOSTART_VAR = "HWPOOL_AUTOSTART"
RECONNECT_VAR = "HWPOOL_RECONNECT_TIMEOUT"


def autostart_from_env(environ: Mapping[str, str]) -> bool:
    """``HWPOOL_AUTOSTART``: ``0`` turns autostart off, ``1`` (or unset, or empty) leaves it on;
    anything else is a ValueError naming the variable."""
    raw = environ.get(AUTOSTART_VAR, "")
    if raw not in ("", "0", "1"):
        raise ValueError(f"{AUTOSTART_VAR} must be 0 or 1, got {raw!r}")
    return raw != "0"


def reconnect_timeout_from_env(environ: Mapping[str, str]) -> float | None:
    """``HWPOOL_RECONNECT_TIMEOUT``: how many seconds ``hwpool run`` waits for a server that
    went away before it gives its lease up (and ends the job); unset or empty: until the
    server is back. Anything but a finite number >= 0 is a ValueError naming the variable."""
    raw = environ.get(RECONNECT_VAR, "")
    if raw == "":
        return None
    return seconds_from_text(raw, RECONNECT_VAR)


def seconds_from_text(text: str, name: str) -> float:
    """A finite number of seconds >= 0 written in ``text``; ValueError naming ``name``."""
    try:
        value = float(text) if len(text) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {text[:40]!r}")
    return value


# Each parser below imports its module when it runs (PLC0415 is off for this file): only
# when its variable is set.
def _num_gpus(environ: Mapping[str, str]) -> None:
    """Parsed on its own, without the rest of GPU detection (which may call nvidia-smi)."""
    from .._host._detect import NUM_GPUS_VAR, detect_gpus

    detect_gpus({NUM_GPUS_VAR: environ[NUM_GPUS_VAR]})


def _threads(environ: Mapping[str, str]) -> None:
    from .._host._sizing import threads_from_env

    threads_from_env(environ)


def _spin(environ: Mapping[str, str]) -> None:
    from .._host._sizing import spin_from_env

    spin_from_env(environ)


def _numa(environ: Mapping[str, str]) -> None:
    from .._numa._pages import numa_mode

    numa_mode(environ)


def _keep(environ: Mapping[str, str]) -> None:
    from .._jobs._state import keep_from_env

    keep_from_env(environ)


def _notify_timeout(environ: Mapping[str, str]) -> None:
    from .._jobs._notify import notify_timeout_from_env

    notify_timeout_from_env(environ)


def _log_max(environ: Mapping[str, str]) -> None:
    from .._jobs._state import log_cap_from_env

    log_cap_from_env(environ)


CHECKED: dict[str, Callable[[Mapping[str, str]], object]] = {
    "HWPOOL_NUM_GPUS": _num_gpus,
    "HWPOOL_THREADS": _threads,
    "HWPOOL_SPIN": _spin,
    "HWPOOL_NUMA": _numa,
    AUTOSTART_VAR: autostart_from_env,
    RECONNECT_VAR: reconnect_timeout_from_env,
    "HWPOOL_JOBS_KEEP": _keep,
    "HWPOOL_JOBS_KEEP_COUNT": _keep,
    "HWPOOL_JOBS_LOG_MAX": _log_max,
    "HWPOOL_NOTIFY_TIMEOUT": _notify_timeout,
}
"""Each variable checked, and its parser (which reads it from the environment given); the
names are the parsers' modules' own (``tests/cli/test_startup.py`` checks)."""


def check_environment(environ: Mapping[str, str]) -> None:
    """Parse every ``HWPOOL_*`` variable set that the library reads; ValueError names the
    first bad one. Runs no subprocess."""
    for variable, parse in CHECKED.items():
        if variable in environ:
            parse(environ)
