"""CPU topology: online CPUs, NUMA nodes, SMT siblings, big cores and the cgroup CPU quota.

Everything is read from Linux sysfs, procfs and cgroupfs under one injectable ``root`` so that
tests can point it at a fake tree. A file that is missing or unreadable means "unknown" and
falls back to the simplest truthful answer (one NUMA node, no SMT, homogeneous cores, no quota);
on systems without sysfs the online CPUs come from ``os.cpu_count()``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .._check import check_int, is_ascii_int
from ._cgroup import cgroup_cpu_quota

__all__ = ["BIG_CORE_RATIO", "CPUTopology", "NumaNode", "cpu_topology", "parse_cpu_list"]

CPU_DIR = "sys/devices/system/cpu"
NODE_DIR = "sys/devices/system/node"
INTEL_CORE_CPUS = "sys/devices/cpu_core/cpus"
INTEL_ATOM_CPUS = "sys/devices/cpu_atom/cpus"
# A core is "big" when its capacity (or max frequency) is at least 5/8 of the largest one.
BIG_CORE_RATIO = (5, 8)


@dataclass(frozen=True, slots=True)
class NumaNode:
    """One NUMA node and its online CPUs (sorted)."""

    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CPUTopology:
    """A snapshot of the CPUs this process sees and may use.

    ``usable`` is ``min(len(affinity), ceil(cgroup_quota))``, never below 1: the number of CPUs
    worth of work this process can actually get done at once. ``big_cores`` is empty on a
    homogeneous CPU. ``smt_groups`` lists each physical core's hardware threads, the first one
    being the core's primary.
    """

    online: tuple[int, ...]
    affinity: tuple[int, ...]
    nodes: tuple[NumaNode, ...]
    smt_groups: tuple[tuple[int, ...], ...]
    big_cores: tuple[int, ...]
    cgroup_quota: float | None
    usable: int


def cpu_topology(
    root: str | os.PathLike[str] = "/", *, affinity: Iterable[int] | None = None
) -> CPUTopology:
    """Read the CPU topology under ``root`` (``/`` for the real machine).

    ``affinity`` overrides the process's CPU mask (default: ``os.sched_getaffinity(0)``, or all
    online CPUs where that call does not exist). Raises TypeError/ValueError for an ``affinity``
    that is not a non-empty collection of CPU numbers >= 0; never raises for odd system files.
    """
    base = Path(root)
    mask = _check_affinity(affinity) if affinity is not None else None
    online = _online_cpus(base)
    allowed = mask if mask is not None else _process_affinity(online)
    quota = cgroup_cpu_quota(base)
    usable = len(allowed) if quota is None else min(len(allowed), math.ceil(quota))
    return CPUTopology(
        online=online,
        affinity=allowed,
        nodes=_numa_nodes(base, online),
        smt_groups=_smt_groups(base, online),
        big_cores=_big_cores(base, online),
        cgroup_quota=quota,
        usable=max(1, usable),
    )


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Parse a kernel CPU list such as ``0-3,8,10-11`` into sorted unique CPU numbers.

    Raises ValueError naming the text when it is malformed; an empty list gives ``()``.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, sep, last = part.partition("-")
        if not is_ascii_int(first) or (sep and not is_ascii_int(last)):
            raise ValueError(f"malformed CPU list {text!r}")
        low, high = int(first), int(last) if sep else int(first)
        if high < low:
            raise ValueError(f"malformed CPU list {text!r}")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def _check_affinity(affinity: Iterable[int]) -> tuple[int, ...]:
    cpus = tuple(check_int("affinity CPU", cpu, minimum=0) for cpu in affinity)
    if not cpus:
        raise ValueError(f"affinity must name at least one CPU, got {affinity!r}")
    return tuple(sorted(set(cpus)))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except (OSError, ValueError):
        return None


def _read_cpu_list(path: Path) -> tuple[int, ...] | None:
    """The CPU list in ``path``, or None when it is missing or malformed."""
    text = _read_text(path)
    if text is None:
        return None
    try:
        return parse_cpu_list(text)
    except ValueError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    return int(text.strip()) if text is not None and is_ascii_int(text.strip()) else None


def _online_cpus(base: Path) -> tuple[int, ...]:
    cpus = _read_cpu_list(base / CPU_DIR / "online")
    if cpus:
        return cpus
    return tuple(range(os.cpu_count() or 1))


def _process_affinity(online: tuple[int, ...]) -> tuple[int, ...]:
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return online


def _numa_nodes(base: Path, online: tuple[int, ...]) -> tuple[NumaNode, ...]:
    """NUMA nodes with their online CPUs; one node 0 holding every CPU when sysfs has none."""
    nodes: list[NumaNode] = []
    present = set(online)
    node_dir = base / NODE_DIR
    entries = sorted(node_dir.glob("node[0-9]*")) if node_dir.is_dir() else []
    for entry in entries:
        suffix = entry.name.removeprefix("node")
        cpus = _read_cpu_list(entry / "cpulist")
        if is_ascii_int(suffix) and cpus is not None:
            nodes.append(NumaNode(int(suffix), tuple(c for c in cpus if c in present)))
    if not nodes:
        return (NumaNode(0, online),)
    return tuple(sorted(nodes, key=lambda node: node.id))


def _smt_groups(base: Path, online: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Hardware-thread groups of each core, from ``topology/thread_siblings_list``."""
    present = set(online)
    groups: set[tuple[int, ...]] = set()
    for cpu in online:
        topo = base / CPU_DIR / f"cpu{cpu}" / "topology"
        siblings = _read_cpu_list(topo / "thread_siblings_list") or (cpu,)
        group = tuple(c for c in siblings if c in present) or (cpu,)
        groups.add(group if cpu in group else (cpu,))
    return tuple(sorted(groups))


def _big_cores(base: Path, online: tuple[int, ...]) -> tuple[int, ...]:
    """Big cores of a heterogeneous CPU; ``()`` on a homogeneous one or when unknown.

    Intel hybrid parts list their P-cores in ``cpu_core/cpus`` (E-cores in ``cpu_atom``);
    elsewhere a core is big when its ``cpu_capacity``, else its ``cpuinfo_max_freq``, is at
    least 5/8 of the largest.
    """
    intel = _intel_big_cores(base, online)
    if intel is not None:
        return intel
    for name in ("cpu_capacity", "cpufreq/cpuinfo_max_freq"):
        values = {cpu: _read_int(base / CPU_DIR / f"cpu{cpu}" / name) for cpu in online}
        known = {cpu: v for cpu, v in values.items() if v is not None}
        if len(known) == len(online) and known:
            return _above_ratio(known)
    return ()


def _intel_big_cores(base: Path, online: tuple[int, ...]) -> tuple[int, ...] | None:
    core = _read_cpu_list(base / INTEL_CORE_CPUS)
    atom = _read_cpu_list(base / INTEL_ATOM_CPUS)
    if core is None or atom is None:
        return None
    present = set(online)
    big = tuple(c for c in core if c in present)
    small = [c for c in atom if c in present]
    return big if big and small else ()


def _above_ratio(values: dict[int, int]) -> tuple[int, ...]:
    top = max(values.values())
    num, den = BIG_CORE_RATIO
    big = tuple(sorted(cpu for cpu, v in values.items() if v * den >= top * num))
    return () if len(big) == len(values) else big
