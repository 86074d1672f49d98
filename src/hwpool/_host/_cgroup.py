"""The CPU quota the process's cgroup grants, read from cgroup v2 or v1 under one root path.

cgroup v2 states it in ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``); v1 in
``cpu.cfs_quota_us`` (``-1`` when unlimited) and ``cpu.cfs_period_us``. A limit set on any
ancestor cgroup applies too, so every level from the process's cgroup up to the mount is read
and the smallest quota wins. Missing, empty or malformed files mean "no limit here".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .._check import is_ascii_int

__all__ = ["cgroup_cpu_quota"]

CGROUP_FILE = "proc/self/cgroup"
MOUNTINFO_FILE = "proc/self/mountinfo"
DEFAULT_V2_MOUNT = "/sys/fs/cgroup"
DEFAULT_V1_MOUNTS = ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True, slots=True)
class _Mount:
    """One cgroup filesystem mount: its type, the subtree it shows, and where it is mounted."""

    fstype: str
    root: str
    point: str
    options: frozenset[str]


def cgroup_cpu_quota(base: Path) -> float | None:
    """CPUs' worth of time the cgroup grants per period (e.g. 1.5), or None when unlimited."""
    paths = _memberships(base)
    mounts = _mounts(base)
    quotas = [q for q in (_quota_v2(base, paths, mounts), _quota_v1(base, paths, mounts)) if q]
    return min(quotas) if quotas else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (OSError, ValueError):
        return None


def _memberships(base: Path) -> dict[str, str]:
    """Controller list (``""`` for v2) -> cgroup path, from ``/proc/self/cgroup``."""
    paths: dict[str, str] = {}
    for line in (_read(base / CGROUP_FILE) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    return paths


def _mounts(base: Path) -> list[_Mount]:
    """cgroup and cgroup2 mounts listed in ``/proc/self/mountinfo``."""
    mounts: list[_Mount] = []
    for line in (_read(base / MOUNTINFO_FILE) or "").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 4 or not fields[dash + 1].startswith("cgroup"):
            continue
        options = frozenset(fields[dash + 3].split(","))
        mounts.append(_Mount(fields[dash + 1], _unescape(fields[3]), _unescape(fields[4]), options))
    return mounts


def _unescape(field: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _quota_v2(base: Path, paths: dict[str, str], mounts: list[_Mount]) -> float | None:
    points = [m for m in mounts if m.fstype == "cgroup2"]
    if not points and not mounts and (base / DEFAULT_V2_MOUNT[1:] / "cgroup.controllers").exists():
        points = [_Mount("cgroup2", "/", DEFAULT_V2_MOUNT, frozenset())]
    if not points or "" not in paths:
        return None
    dirs = _levels(base, points[0], paths[""])
    return _smallest(_parse_cpu_max(_read(d / "cpu.max")) for d in dirs)


def _quota_v1(base: Path, paths: dict[str, str], mounts: list[_Mount]) -> float | None:
    path = next((p for ctl, p in paths.items() if "cpu" in ctl.split(",")), None)
    if path is None:
        return None
    points = [m for m in mounts if m.fstype == "cgroup" and "cpu" in m.options]
    if not points and not mounts:
        points = [_Mount("cgroup", "/", p, frozenset()) for p in DEFAULT_V1_MOUNTS]
        points = [m for m in points if (base / m.point[1:]).is_dir()]
    if not points:
        return None
    dirs = _levels(base, points[0], path)
    return _smallest(_parse_cfs(d) for d in dirs)


def _levels(base: Path, mount: _Mount, cgroup_path: str) -> list[Path]:
    """The process's cgroup directory and each ancestor up to the mount point."""
    top = base / mount.point.lstrip("/")
    relative = cgroup_path
    if mount.root != "/" and (relative == mount.root or relative.startswith(mount.root + "/")):
        relative = relative[len(mount.root) :]
    parts = [p for p in relative.split("/") if p and p not in (".", "..")]
    leaf = top.joinpath(*parts)
    if not leaf.is_dir():
        return [top]
    return [top.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _smallest(quotas: Iterable[float | None]) -> float | None:
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def _parse_cpu_max(text: str | None) -> float | None:
    fields = (text or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _parse_cfs(directory: Path) -> float | None:
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota.strip(), period.strip())


def _ratio(quota: str, period: str) -> float | None:
    if not (is_ascii_int(quota) and is_ascii_int(period)) or int(period) == 0 or int(quota) == 0:
        return None
    return int(quota) / int(period)
