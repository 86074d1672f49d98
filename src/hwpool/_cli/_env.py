"""The ``HWPOOL_*`` variables, checked before a command does any work.

The library parts the command drives read four variables, and ``hwpool run`` two of its own
(``HWPOOL_AUTOSTART``, ``HWPOOL_RECONNECT_TIMEOUT``). Each is
parsed here by the library's own parser (so the command and the library can never disagree)
before anything runs: a malformed ``HWPOOL_SPIN`` must stop ``hwpool demo`` at once, not after
its GPU stage, when the CPU pool first reads it.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._host._detect import NUM_GPUS_VAR, detect_gpus
from .._host._sizing import spin_from_env, threads_from_env
from .._jobs._state import keep_from_env
from .._numa._pages import numa_mode
from ._autostart import autostart_from_env, reconnect_timeout_from_env

__all__ = ["check_environment"]


def check_environment(environ: Mapping[str, str]) -> None:
    """Parse every ``HWPOOL_*`` variable the library reads; ValueError names the first bad one.

    Runs no subprocess: ``HWPOOL_NUM_GPUS`` is parsed on its own, without the rest of GPU
    detection (which may call nvidia-smi).
    """
    if NUM_GPUS_VAR in environ:
        detect_gpus({NUM_GPUS_VAR: environ[NUM_GPUS_VAR]})
    threads_from_env(environ)
    spin_from_env(environ)
    numa_mode(environ)
    autostart_from_env(environ)
    reconnect_timeout_from_env(environ)
    keep_from_env(environ)
