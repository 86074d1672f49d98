"""A fake ``pynvml`` driven by a JSON file (``pynvml.py`` here), for server processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DIRECTORY = str(Path(__file__).resolve().parent)
"""Put this first on a server's PYTHONPATH to have it import the fake as ``pynvml``."""


def gpu(
    uuid: str,
    memory_mib: int = 16384,
    *,
    used_mib: int = 0,
    utilization: int = 0,
    processes: dict[int, int | None] | None = None,
    failing: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One device of the state file."""
    return {
        "uuid": uuid, "memory_mib": memory_mib, "used_mib": used_mib, "utilization": utilization,
        "processes": {str(pid): mib for pid, mib in (processes or {}).items()},
        "failing": failing or {},
    }  # fmt: skip


def write_state(
    path: Path, gpus: list[dict[str, Any]], failing: dict[str, str] | None = None
) -> None:
    """Replace the state file at ``path`` at once (a reader never sees half of it)."""
    part = path.with_suffix(".part")
    part.write_text(json.dumps({"gpus": gpus, "failing": failing or {}}))
    os.replace(part, path)
