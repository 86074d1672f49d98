"""A fake ``pynvml`` over a live machine, for the watcher's tests and nothing else.

Where :func:`fakes.gpus.nvml_module` writes a static machine out as a module file (for
detection, also in server subprocesses), this fake is an object standing in for the module,
and its devices change between samples as a test says: processes appear and disappear,
memory and utilisation move, and any NVML function can be made to fail, on every device or on
one, to test errors in the middle of a run. Install it with
``monkeypatch.setitem(sys.modules, "pynvml", fake)`` or hand it to ``NvmlSampler`` directly.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

MIB = 2**20


class NVMLError(Exception):
    """The fake's base error, as in pynvml."""


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


@dataclass
class LiveGPU:
    """One device: its memory (MiB), use (MiB; None: NVML gives no ``used``), utilisation (%),
    compute and graphics processes (pid -> MiB; None: NVML cannot say), MIG instances in its
    place (None: no MIG support), and ``failing``: NVML function name -> error, on this device."""

    uuid: str
    memory_mib: int = 81920
    used_mib: int | None = 0
    utilization: int = 0
    processes: dict[int, int | None] = field(default_factory=dict)
    graphics: dict[int, int | None] = field(default_factory=dict)
    migs: list[LiveGPU] | None = None
    failing: dict[str, str] = field(default_factory=dict)


class FakeNVML(types.ModuleType):
    """The fake module over ``gpus``; ``failing``: function name -> error, on every call."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Uninitialized = NVMLError_Uninitialized

    def __init__(self, gpus: list[LiveGPU]) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.failing: dict[str, str] = {}
        self.inits = 0
        self.shutdowns = 0
        self.initialised = False

    def _check(self, name: str, gpu: LiveGPU | None = None) -> None:
        message = self.failing.get(name) or (gpu.failing.get(name) if gpu else None)
        if message:
            raise NVMLError(message)
        if name != "nvmlInit" and not self.initialised:
            raise NVMLError_Uninitialized("Uninitialized")

    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        self.inits += 1
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> LiveGPU:
        self._check("nvmlDeviceGetHandleByIndex")
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, gpu: LiveGPU) -> bytes:
        self._check("nvmlDeviceGetUUID", gpu)
        return gpu.uuid.encode()  # bytes, as older releases return

    def nvmlDeviceGetMemoryInfo(self, gpu: LiveGPU) -> types.SimpleNamespace:
        self._check("nvmlDeviceGetMemoryInfo", gpu)
        memory = types.SimpleNamespace(total=gpu.memory_mib * MIB + 4096)  # floored
        if gpu.used_mib is not None:
            memory.used = max(0, gpu.used_mib * MIB - 4096)  # rounded up
        return memory

    def nvmlDeviceGetUtilizationRates(self, gpu: LiveGPU) -> types.SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates", gpu)
        return types.SimpleNamespace(gpu=gpu.utilization, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        self._check("nvmlDeviceGetComputeRunningProcesses", gpu)
        return _listed(gpu.processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        self._check("nvmlDeviceGetGraphicsRunningProcesses", gpu)
        return _listed(gpu.graphics)

    def nvmlDeviceGetMigMode(self, gpu: LiveGPU) -> tuple[int, int]:
        self._check("nvmlDeviceGetMigMode", gpu)  # "Insufficient Permissions": see _nvml
        if gpu.migs is None:
            raise NVMLError_NotSupported("Not Supported")
        return (1 if gpu.migs else 0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: LiveGPU) -> int:
        return len(gpu.migs or [])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: LiveGPU, i: int) -> LiveGPU:
        return (gpu.migs or [])[i]


def _listed(processes: dict[int, int | None]) -> list[types.SimpleNamespace]:
    """NVML's process records: bytes in use, None where NVML cannot say (as pynvml gives)."""
    return [
        types.SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
        for pid, mib in processes.items()
    ]
