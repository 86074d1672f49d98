"""The GPUs' live state through NVML (``nvidia-ml-py``, imported as ``pynvml``).

NVML is initialised once, on the first sample, and shut down by :meth:`NvmlSampler.close`:
``nvmlInit`` costs far more than a poll. A failure never reaches the caller. One call that
fails (the utilisation of one GPU, the process list of another) makes that value unknown for
this sample; a GPU whose handle or UUID fails (``NVML_ERROR_GPU_IS_LOST``,
``NVML_ERROR_UNKNOWN``) is left out of this sample and named in its problem, and the others
are read; a failure that leaves no device list (``nvmlDeviceGetCount`` raising) makes the
whole sample unknown and initialises NVML again on the next one.

Processes are the union of NVML's compute and graphics lists (a process in both counts once,
with the larger figure). Each list is asked through the newest entry point the driver has:
``..._v3``, else ``..._v2``, else the unversioned one (drivers before 510 lack ``_v3``, and
nvidia-ml-py's unversioned name calls ``_v3``: NVML_ERROR_FUNCTION_NOT_FOUND); the one that
answered is kept. A MIG instance has no utilisation in NVML: None, not asked.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .._host._nvml import NVML_ERROR_FUNCTION_NOT_FOUND, nvml_code, nvml_devices, read_memory
from .._host._nvml import nvml_why as _why
from ._sample import GPUProcess, GPUReading, Sample, mib_up

__all__ = ["NvmlSampler"]

_PROCESS_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")
_SUFFIXES = ("_v3", "_v2", "")  # newest first, as the driver may lack the newer ones


class _Missing(Exception):
    """None of a process list's entry points exists in this driver or nvidia-ml-py."""


def _missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the entry point is not in the driver's NVML: FunctionNotFound, or
    nvidia-ml-py's NVMLLibraryMismatchError for its unversioned name over an older driver."""
    return (
        nvml_code(exc) == NVML_ERROR_FUNCTION_NOT_FOUND
        or type(exc).__name__ == "NVMLLibraryMismatchError"
    )


class NvmlSampler:
    """Samples through ``nvml`` (the ``pynvml`` module, or a fake with its functions)."""

    source = "nvml"

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._ready = False
        self._lists: dict[str, str] = {}  # process list -> the entry point that answered

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
        lost: list[tuple[str, str]] = []
        try:
            devices = nvml_devices(self._nvml, lost)
        except Exception as exc:
            self.close()  # initialise again next time: NVML may have lost the GPU or driver
            return Sample(self.source, (), f"NVML failed ({_why(exc)})")
        problems = [f"{device}: {why}" for device, why in lost]
        gpus = tuple(self._read(uuid, h, mig, problems) for uuid, h, mig in devices)
        return Sample(self.source, gpus, "; ".join(problems))

    def close(self) -> None:
        """Shut NVML down if this sampler initialised it."""
        if self._ready:
            self._ready = False
            with contextlib.suppress(Exception):  # nothing to undo
                self._nvml.nvmlShutdown()

    def _read(self, uuid: str, handle: object, mig: bool, problems: list[str]) -> GPUReading:
        try:
            total, used, reserved = read_memory(self._nvml, handle)
        except Exception as exc:
            problems.append(f"{uuid}: nvmlDeviceGetMemoryInfo failed ({_why(exc)})")
            total = used = reserved = None
        utilization = None
        if not mig:
            rates = self._ask(problems, uuid, "nvmlDeviceGetUtilizationRates", handle)
            utilization = getattr(rates, "gpu", None)
        return GPUReading(
            uuid,
            total,
            used,
            utilization if isinstance(utilization, int) else None,
            self._processes(uuid, handle, problems),
            reserved,
        )

    def _processes(
        self, uuid: str, handle: object, problems: list[str]
    ) -> tuple[GPUProcess, ...] | None:
        found: dict[int, int | None] = {}
        for name in _PROCESS_LISTS:
            try:
                listed = self._list(name, handle)
            except _Missing:
                continue  # an old nvidia-ml-py without the graphics list
            except Exception as exc:
                problems.append(f"{uuid}: {name} failed ({_why(exc)})")
                return None
            for info in listed:
                pid, mib = int(info.pid), mib_up(getattr(info, "usedGpuMemory", None))
                found[pid] = _larger(found[pid], mib) if pid in found else mib
        return tuple(GPUProcess(pid, uuid, mib) for pid, mib in sorted(found.items()))

    def _list(self, name: str, handle: object) -> Any:
        """One process list of ``handle`` through the newest entry point there is (see the
        module docstring); _Missing where there is none."""
        known = self._lists.get(name)
        for entry in [known] if known else [name + suffix for suffix in _SUFFIXES]:
            function = getattr(self._nvml, entry, None)
            if function is None:
                continue
            try:
                listed = function(handle)
            except Exception as exc:
                if known is None and _missing(exc):
                    continue
                raise
            self._lists[name] = entry
            return listed
        raise _Missing(name)

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
