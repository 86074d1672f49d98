"""How many threads a CPU job's team should have, and the worker spin budget.

Counting follows OpenMP's ``OMP_NUM_THREADS``: a *team* is the workers plus the calling thread.
The environment variables of the CPU pool are read here and nowhere else:

- ``HWPOOL_THREADS``: team size, a positive integer (overridden by :func:`set_threads`).
- ``HWPOOL_SPIN``: how many times a parked worker polls for new work before it sleeps, an
  integer >= 0 (default :data:`DEFAULT_SPIN`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from .._check import check_int, env_int
from ._topology import CPUTopology, cpu_topology

__all__ = ["DEFAULT_SPIN", "effective_threads", "set_threads", "spin_from_env"]

THREADS_VAR = "HWPOOL_THREADS"
SPIN_VAR = "HWPOOL_SPIN"
# Measured with bench/bench_cpu_pool.py (docs/cpu.md, "Spin"): on a GIL build a polling worker
# only takes the GIL away from the thread that is about to publish work, so it never pays.
DEFAULT_SPIN = 0

_forced_lock = threading.Lock()
_forced: int | None = None


def set_threads(n: int | None) -> None:
    """Force the team size of :func:`effective_threads` in this process; ``None`` clears it.

    Raises TypeError unless ``n`` is an int or None, ValueError when it is below 1.
    """
    global _forced
    number = None if n is None else check_int("n", n, minimum=1)
    with _forced_lock:
        _forced = number


def effective_threads(
    *, topology: CPUTopology | None = None, environ: Mapping[str, str] | None = None
) -> int:
    """The team size (workers + caller) that ``CPUPool.from_env()`` would use now.

    First answer wins: :func:`set_threads`; ``HWPOOL_THREADS``; on a heterogeneous CPU the big
    cores in the affinity mask (capped by the cgroup quota); else the usable CPU count
    (affinity mask and cgroup quota). ``topology`` and ``environ`` replace the live machine and
    ``os.environ``. Raises ValueError naming ``HWPOOL_THREADS`` when it is not a positive int.
    """
    with _forced_lock:
        forced = _forced
    if forced is not None:
        return forced
    from_env = threads_from_env(os.environ if environ is None else environ)
    if from_env is not None:
        return from_env
    return _team_from_topology(cpu_topology() if topology is None else topology)


def threads_from_env(environ: Mapping[str, str]) -> int | None:
    """``HWPOOL_THREADS`` parsed strictly (ASCII digits, >= 1), or None when it is not set."""
    return env_int(THREADS_VAR, environ, minimum=1)


def spin_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``HWPOOL_SPIN`` parsed strictly (ASCII digits), or :data:`DEFAULT_SPIN` when unset."""
    spin = env_int(SPIN_VAR, os.environ if environ is None else environ, minimum=0)
    return DEFAULT_SPIN if spin is None else spin


def _team_from_topology(topology: CPUTopology) -> int:
    """Big cores the process may use when the CPU is heterogeneous, else the usable CPUs."""
    allowed = set(topology.affinity)
    big = [cpu for cpu in topology.big_cores if cpu in allowed]
    if big:
        return max(1, min(len(big), topology.usable))
    return topology.usable
