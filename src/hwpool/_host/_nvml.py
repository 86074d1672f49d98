"""GPUs as NVML reports them, through ``nvidia-ml-py`` (``import pynvml``), when installed.

NVML is the library nvidia-smi itself uses: it gives exact memory totals, MIG instances and
UUIDs in-process, without a subprocess. It is optional (``pip install 'hwpool[nvml]'``); when
it is missing or fails (no driver, a container without the library), detection falls back to
nvidia-smi and says why. A MIG-enabled GPU is replaced by its MIG devices, as in CUDA.

A MIG device's memory is read on its own MIG handle: the memory of its GPU instance, which
the compute instances of that GPU instance share (``memory_group``, from
``nvmlDeviceGetGpuInstanceId``). The parent GPU's handle is asked only for its UUID and MIG
mode: NVML documents that its memory info in MIG mode needs privileges (non-root callers get
NVML_ERROR_NO_PERMISSION). Where the MIG mode itself cannot be read, the MIG handles are
looked up by index anyway (``nvmlDeviceGetMigDeviceHandleByIndex``).

Memory in use is read from the same record as the total (``nvmlDeviceGetMemoryInfo``), on the
MIG device handle for an instance; :func:`nvml_memory_in_use` reads it again, uncached.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import replace
from types import ModuleType
from typing import Any

from ._devices import GPUInfo, memory_group

__all__ = ["nvml_devices", "nvml_memory_in_use", "nvml_text", "query_nvml"]

_MIB = 2**20
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_MIG_SLOTS = 7  # MIG devices per GPU on every MIG-capable GPU so far (A100, H100, H200)

_lock = threading.Lock()
_answers: dict[int, tuple[ModuleType, tuple[GPUInfo, ...] | None, str]] = {}


def query_nvml() -> tuple[tuple[GPUInfo, ...] | None, str]:
    """The devices NVML lists (None when NVML is missing or failed) and what happened.

    Cached per process for each ``pynvml`` module object (a fake one in tests is asked anew).
    """
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None, "NVML not used (pynvml not installed: pip install 'hwpool[nvml]')"
    with _lock:
        cached = _answers.get(id(nvml))
        if cached is None or cached[0] is not nvml:
            cached = (nvml, *_ask(nvml))
            _answers[id(nvml)] = cached
    return cached[1], cached[2]


def _ask(nvml: Any) -> tuple[tuple[GPUInfo, ...] | None, str]:
    try:
        nvml.nvmlInit()
    except Exception as exc:  # any failure of an optional library falls back to nvidia-smi
        return None, f"NVML failed at init ({_why(exc)})"
    try:
        count, devices = _devices(nvml)
    except Exception as exc:
        return None, f"NVML failed ({_why(exc)})"
    finally:
        with contextlib.suppress(Exception):  # nothing to undo: the answer stands
            nvml.nvmlShutdown()
    migs = sum(d.is_mig for d in devices)
    parents = len({d.parent for d in devices if d.parent})
    outcome = f"NVML listed {count} GPU{'s' if count != 1 else ''}"
    return devices, outcome + (f", {migs} MIG instances on {parents} of them" if migs else "")


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _devices(nvml: Any) -> tuple[int, tuple[GPUInfo, ...]]:
    """How many physical GPUs NVML counts, and the devices: MIG instances in their place."""
    devices: list[GPUInfo] = []
    count = int(nvml.nvmlDeviceGetCount())
    for i in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        parent = nvml_text(nvml.nvmlDeviceGetUUID(handle))  # the parent's memory: see above
        migs = [_mig_info(nvml, h, parent) for h in _mig_handles(nvml, handle)]
        found = migs or [_info(nvml, handle, str(i), None)]
        devices += [replace(device, index=len(devices) + j) for j, device in enumerate(found)]
    return count, tuple(devices)


def _mig_info(nvml: Any, handle: object, parent: str) -> GPUInfo:
    """A MIG device: :func:`_info` on its handle, with the ``memory_group`` of its GPU
    instance (None where NVML does not say which)."""
    info = _info(nvml, handle, "", parent)
    try:
        instance = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
    except Exception:  # an old nvidia-ml-py, or a driver that will not say
        return info
    return replace(info, memory_group=memory_group(parent, instance))


def _info(nvml: Any, handle: object, index: str, parent: str | None) -> GPUInfo:
    uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
    name = nvml_text(nvml.nvmlDeviceGetName(handle))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    total = int(memory.total) // _MIB  # rounded down: never more than the device has
    return GPUInfo(0, index or uuid, uuid, total, name, parent, _used_mib(memory))


def _used_mib(memory: object) -> int | None:
    """``memory.used`` (bytes) in MiB rounded up: never less than is in use; None if absent."""
    used = getattr(memory, "used", None)
    if not isinstance(used, int) or isinstance(used, bool) or used < 0:
        return None
    return -(-used // _MIB)


def nvml_memory_in_use() -> dict[str, int | None] | None:
    """The memory in use now (MiB, rounded up) on every device NVML lists, GPUs and MIG
    instances, by UUID; None when NVML is missing or fails. Not cached: each call reads anew.
    """
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # ImportError, or no driver: the caller asks nvidia-smi
        return None
    try:
        return _in_use(nvml)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _in_use(nvml: Any) -> dict[str, int | None]:
    used: dict[str, int | None] = {}
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        for device in [handle, *_mig_handles(nvml, handle)]:
            used[nvml_text(nvml.nvmlDeviceGetUUID(device))] = _read_used(nvml, device)
    return used


def _read_used(nvml: Any, handle: object) -> int | None:
    """One device's memory in use; None where NVML will not say (an instance, say)."""
    try:
        return _used_mib(nvml.nvmlDeviceGetMemoryInfo(handle))
    except Exception:
        return None


def nvml_devices(nvml: Any) -> list[tuple[str, object, bool]]:
    """Every device as CUDA sees it: its UUID, its NVML handle and whether it is a MIG
    instance; a MIG-enabled GPU's instances stand in its place, as in detection. NVML must be
    initialised; raises what NVML raises (the watcher turns that into an unknown sample)."""
    devices: list[tuple[str, object, bool]] = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        migs = _mig_handles(nvml, handle)
        for device in migs or [handle]:
            devices.append((nvml_text(nvml.nvmlDeviceGetUUID(device)), device, bool(migs)))
    return devices


def _mig_handles(nvml: Any, handle: object) -> list[object]:
    """The MIG devices on ``handle``: none where MIG is off or not supported.

    Where the MIG mode cannot be read for another reason (NVML_ERROR_NO_PERMISSION, say),
    the slots are probed anyway: a GPU without MIG devices answers each with an error.
    """
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception as exc:
        if _not_supported(nvml, exc):  # a GPU without MIG
            return []
        current = _MIG_ENABLED  # unknown: look for MIG devices
    if current != _MIG_ENABLED:
        return []
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:  # as above: probe every slot a GPU has had so far
        slots = _MIG_SLOTS
    handles = []
    for slot in range(slots):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
        except Exception:  # NVMLError_NotFound: an empty slot
            continue
    return handles


def _not_supported(nvml: Any, exc: Exception) -> bool:
    """Whether ``exc`` is NVML_ERROR_NOT_SUPPORTED (code 3), by class or by code."""
    kind = getattr(nvml, "NVMLError_NotSupported", None)
    return (isinstance(kind, type) and isinstance(exc, kind)) or getattr(exc, "value", None) == 3


def nvml_text(value: object) -> str:
    """NVML strings are ``bytes`` in older nvidia-ml-py releases and ``str`` in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)
