"""The GPUs' live state through NVML (``nvidia-ml-py``, imported as ``pynvml``).

NVML is initialised once, on the first sample, and shut down by :meth:`NvmlSampler.close`:
``nvmlInit`` costs far more than a poll. A failure never reaches the caller. One call that
fails (the utilisation of one GPU, the process list of another) makes that value unknown for
this sample; a failure that leaves no device list (``nvmlDeviceGetCount`` raising, a lost
GPU) makes the whole sample unknown and initialises NVML again on the next one.

Processes are the union of NVML's compute and graphics lists (a process in both counts once,
with the larger figure). A MIG instance has no utilisation in NVML: None, not asked.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .._host._nvml import nvml_devices
from ._sample import GPUProcess, GPUReading, Sample, mib_up

__all__ = ["NvmlSampler"]

_PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class NvmlSampler:
    """Samples through ``nvml`` (the ``pynvml`` module, or a fake with its functions)."""

    source = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._ready = False

    def start(self) -> str:
        """Initialise NVML now: "" if it worked, else what failed, in words."""
        if not self._ready:
            try:
                self._nvml.nvmlInit()
            except Exception as exc:  # an optional library: any failure is an answer
                return f"NVML failed at init ({_why(exc)})"
            self._ready = True
        return ""

    def sample(self) -> Sample:
        """Read every device; see the module docstring for what a failure does."""
        failed = self.start()
        if failed:
            return Sample(self.source, (), failed)
        try:
            devices = nvml_devices(self._nvml)
        except Exception as exc:
            self.close()  # initialise again next time: NVML may have lost the GPU or driver
            return Sample(self.source, (), f"NVML failed ({_why(exc)})")
        problems: list[str] = []
        gpus = tuple(self._read(uuid, h, mig, problems) for uuid, h, mig in devices)
        return Sample(self.source, gpus, "; ".join(problems))

    def close(self) -> None:
        """Shut NVML down if this sampler initialised it."""
        if self._ready:
            self._ready = False
            with contextlib.suppress(Exception):  # nothing to undo
                self._nvml.nvmlShutdown()

    def _read(self, uuid: str, handle: object, mig: bool, problems: list[str]) -> GPUReading:
        memory = self._ask(problems, uuid, "nvmlDeviceGetMemoryInfo", handle)
        total = getattr(memory, "total", None)
        utilization = None
        if not mig:
            rates = self._ask(problems, uuid, "nvmlDeviceGetUtilizationRates", handle)
            utilization = getattr(rates, "gpu", None)
        return GPUReading(
            uuid,
            total // 2**20 if isinstance(total, int) else None,  # rounded down
            mib_up(getattr(memory, "used", None)),
            utilization if isinstance(utilization, int) else None,
            self._processes(uuid, handle, problems),
        )

    def _processes(
        self, uuid: str, handle: object, problems: list[str]
    ) -> tuple[GPUProcess, ...] | None:
        found: dict[int, int | None] = {}
        for name in _PROCESS_LISTS:
            if not hasattr(self._nvml, name):
                continue  # an old nvidia-ml-py without the graphics list
            listed = self._ask(problems, uuid, name, handle)
            if listed is None:
                return None
            for info in listed:
                pid, mib = int(info.pid), mib_up(getattr(info, "usedGpuMemory", None))
                found[pid] = _larger(found[pid], mib) if pid in found else mib
        return tuple(GPUProcess(pid, uuid, mib) for pid, mib in sorted(found.items()))

    def _ask(self, problems: list[str], uuid: str, name: str, handle: object) -> Any:
        """``nvml.<name>(handle)``, or None with the failure noted in ``problems``."""
        try:
            return getattr(self._nvml, name)(handle)
        except Exception as exc:
            problems.append(f"{uuid}: {name} failed ({_why(exc)})")
            return None


def _larger(a: int | None, b: int | None) -> int | None:
    """The larger known figure of two (a process listed twice holds one amount)."""
    return b if a is None else a if b is None else max(a, b)
