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

try:  # as fakes.live_nvml in the tests; as live_nvml in a server's fake pynvml (nvml_file)
    from fakes.nvml_errors import (
        NVMLError,
        NVMLError_FunctionNotFound,
        NVMLError_NotSupported,
        NVMLError_Uninitialized,
        NVMLLibraryMismatchError,
        error,
    )
except ImportError:
    from nvml_errors import (  # type: ignore[no-redef]
        NVMLError,
        NVMLError_FunctionNotFound,
        NVMLError_NotSupported,
        NVMLError_Uninitialized,
        NVMLLibraryMismatchError,
        error,
    )

__all__ = ["FakeNVML", "LiveGPU", "NVMLError", "NVMLError_NotSupported", "NVMLError_Uninitialized"]

MIB = 2**20
MEMORY_V2 = 0x02000028  # nvidia-ml-py's nvmlMemory_v2


@dataclass
class LiveGPU:
    """One device: its memory (MiB), use (MiB; None: NVML gives no ``used``), utilisation (%),
    compute and graphics processes (pid -> MiB; None: NVML cannot say), MIG instances in its
    place (None: no MIG support), ``failing``: NVML function name -> error, on this device
    (an error class suffix such as ``GpuIsLost`` raises NVML's own class, see
    :mod:`fakes.nvml_errors`; other text a plain NVMLError), and the memory the driver
    reserves (MiB, in the v2 memory record; None: a driver without the v2 record)."""

    uuid: str
    memory_mib: int = 81920
    used_mib: int | None = 0
    utilization: int = 0
    processes: dict[int, int | None] = field(default_factory=dict)
    graphics: dict[int, int | None] = field(default_factory=dict)
    migs: list[LiveGPU] | None = None
    failing: dict[str, str] = field(default_factory=dict)
    reserved_mib: int | None = None


class FakeNVML(types.ModuleType):
    """The fake module over ``gpus``; ``failing``: function name -> error, on every call;
    ``driver_lacks``: the C entry points the driver's NVML does not have (as before 510:
    ``nvmlDeviceGetComputeRunningProcesses_v3``), which nvidia-ml-py's functions over them
    answer with NVMLError_FunctionNotFound (NVMLLibraryMismatchError for its unversioned
    process lists, which call ``_v3``)."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Uninitialized = NVMLError_Uninitialized
    nvmlMemory_v2 = MEMORY_V2

    def __init__(self, gpus: list[LiveGPU]) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.failing: dict[str, str] = {}
        self.driver_lacks: set[str] = set()
        self.asked: list[str] = []
        self.inits = 0
        self.shutdowns = 0
        self.initialised = False

    def _check(self, name: str, gpu: LiveGPU | None = None) -> None:
        message = self.failing.get(name) or (gpu.failing.get(name) if gpu else None)
        if message:
            raise error(message)
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
        self._check("nvmlDeviceGetHandleByIndex", self.gpus[i])
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, gpu: LiveGPU) -> bytes:
        self._check("nvmlDeviceGetUUID", gpu)
        return gpu.uuid.encode()  # bytes, as older releases return

    def nvmlDeviceGetMemoryInfo(
        self, gpu: LiveGPU, version: int | None = None
    ) -> types.SimpleNamespace:
        """The v1 record (``used`` counts the reserved memory in), or with ``version`` the v2
        one (``reserved`` apart), as NVML documents them."""
        self._check("nvmlDeviceGetMemoryInfo", gpu)
        total = gpu.memory_mib * MIB + 4096  # floored
        memory = types.SimpleNamespace(total=total)
        if version is not None:
            self._symbol("nvmlDeviceGetMemoryInfo_v2")
            if gpu.reserved_mib is None:
                raise NVMLError_FunctionNotFound()
            memory.reserved = gpu.reserved_mib * MIB
            if gpu.used_mib is not None:
                memory.used = max(0, gpu.used_mib * MIB - 4096)  # rounded up
                memory.free = total - memory.used - memory.reserved
        elif gpu.used_mib is not None:
            memory.used = max(0, (gpu.used_mib + (gpu.reserved_mib or 0)) * MIB - 4096)
            memory.free = total - memory.used
        return memory

    def _symbol(self, name: str) -> None:
        """NVMLError_FunctionNotFound where the driver lacks the C entry point ``name``."""
        self.asked.append(name)
        if name in self.driver_lacks:
            raise NVMLError_FunctionNotFound()

    def nvmlDeviceGetUtilizationRates(self, gpu: LiveGPU) -> types.SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates", gpu)
        return types.SimpleNamespace(gpu=gpu.utilization, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        return self._unversioned("nvmlDeviceGetComputeRunningProcesses", gpu, gpu.processes)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        return self._versioned("nvmlDeviceGetComputeRunningProcesses", "_v3", gpu, gpu.processes)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        return self._versioned("nvmlDeviceGetComputeRunningProcesses", "_v2", gpu, gpu.processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        return self._unversioned("nvmlDeviceGetGraphicsRunningProcesses", gpu, gpu.graphics)

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        return self._versioned("nvmlDeviceGetGraphicsRunningProcesses", "_v3", gpu, gpu.graphics)

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, gpu: LiveGPU) -> list[types.SimpleNamespace]:
        return self._versioned("nvmlDeviceGetGraphicsRunningProcesses", "_v2", gpu, gpu.graphics)

    def _unversioned(
        self, name: str, gpu: LiveGPU, processes: dict[int, int | None]
    ) -> list[types.SimpleNamespace]:
        """nvidia-ml-py's unversioned process list: ``_v3`` underneath."""
        try:
            return self._versioned(name, "_v3", gpu, processes)
        except NVMLError_FunctionNotFound:
            raise NVMLLibraryMismatchError(f"use a versioned function such as {name}_v2") from None

    def _versioned(
        self, name: str, suffix: str, gpu: LiveGPU, processes: dict[int, int | None]
    ) -> list[types.SimpleNamespace]:
        self._check(name, gpu)
        self._symbol(name + suffix)
        return _listed(processes)

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
