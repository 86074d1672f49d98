"""A fake ``pynvml`` whose machine is a JSON file, for a ``hwpool serve`` process in a test.

:mod:`fakes.live_nvml` is an object in the test's own process; a server started as a real
process cannot be driven through it. Put this directory first on the server's PYTHONPATH and
name the state file in ``HWPOOL_FAKE_NVML``: each ``nvmlInit`` and ``nvmlDeviceGetCount`` (the
start of every detection and every sample) reads the file again, so a test changes the
machine between samples by rewriting it (:func:`fakes.nvml_file.write_state`, atomically).
The file holds ``{"gpus": [{"uuid", "memory_mib", "used_mib", "utilization", "processes":
{pid: MiB}, "failing": {function: error}}], "failing": {function: error}}``; a file that
cannot be read keeps the machine as it was.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from live_nvml import (  # tests/fakes, put on the path just above
    FakeNVML,
    LiveGPU,
    NVMLError,
    NVMLError_NotSupported,
    NVMLError_Uninitialized,
)

__all__ = ["NVMLError", "NVMLError_NotSupported", "NVMLError_Uninitialized"]

_STATE = os.environ.get("HWPOOL_FAKE_NVML", "")
_fake = FakeNVML([])


def _load() -> None:
    """Read the state file into the fake (keep the fake as it is if it cannot be read)."""
    try:
        with open(_STATE, encoding="utf-8") as file:
            state = json.load(file)
    except (OSError, ValueError):
        return
    _fake.gpus = [_gpu(raw) for raw in state.get("gpus", [])]
    _fake.failing = dict(state.get("failing", {}))


def _gpu(raw: dict[str, Any]) -> LiveGPU:
    processes = {int(pid): mib for pid, mib in raw.get("processes", {}).items()}
    return LiveGPU(
        raw["uuid"], raw.get("memory_mib", 81920), raw.get("used_mib", 0),
        raw.get("utilization", 0), processes, failing=dict(raw.get("failing", {})),
        reserved_mib=raw.get("reserved_mib"),
    )  # fmt: skip


def nvmlInit() -> None:
    _load()
    _fake.nvmlInit()


def nvmlDeviceGetCount() -> int:
    _load()
    return _fake.nvmlDeviceGetCount()


def nvmlDeviceGetName(handle: LiveGPU) -> bytes:
    """What detection names a device (the live fake has no names)."""
    _fake._check("nvmlDeviceGetName", handle)
    return b"Fake GPU"


def __getattr__(name: str) -> Any:
    """Every other NVML function is the fake's."""
    if name.startswith("nvml"):
        return getattr(_fake, name)
    raise AttributeError(name)
