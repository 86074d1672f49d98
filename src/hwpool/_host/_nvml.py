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

Memory is read with ``nvmlDeviceGetMemoryInfo_v2`` where the driver and nvidia-ml-py have it
(it reports ``reserved``, the driver's and firmware's own), else the original call, whose
``used`` counts the reserved memory in; on the MIG device handle for an instance (the parent's
aggregate needs privileges NVML documents as ``NVML_ERROR_NO_PERMISSION``; it is not asked).
:func:`nvml_memory_in_use` reads the use again, uncached.

Failures follow NVML's documented return codes: a GPU whose handle, UUID or memory cannot be
read (``NVML_ERROR_GPU_IS_LOST``, ``NVML_ERROR_UNKNOWN``, ...) is left out and named with its
error, and the others are used; ``NVML_ERROR_NOT_SUPPORTED`` on the memory query (unified
memory, as on GB10) keeps the GPU with its memory unknown (None).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import replace
from types import ModuleType
from typing import Any, NamedTuple

from ._devices import GPUInfo, memory_group

__all__ = [
    "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED", "Memory", "nvml_code",
    "nvml_devices", "nvml_memory_in_use", "nvml_text", "nvml_why", "query_nvml", "read_memory",
]  # fmt: skip

_MIB = 2**20
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_MIG_SLOTS = 7  # MIG devices per GPU on every MIG-capable GPU so far (A100, H100, H200)
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
_CODES = {"NVMLError_NotSupported": 3, "NVMLError_FunctionNotFound": 13}
"""Codes by pynvml's class names, for an error that carries no ``value``."""

Failed = tuple[tuple[str, str], ...]

_lock = threading.Lock()
_answers: dict[int, tuple[ModuleType, tuple[GPUInfo, ...] | None, str, Failed]] = {}


def query_nvml() -> tuple[tuple[GPUInfo, ...] | None, str, Failed]:
    """The devices NVML lists (None when NVML is missing or failed), what happened, and the
    GPUs left out, each with NVML's error.

    Cached per process for each ``pynvml`` module object (a fake one in tests is asked anew).
    """
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None, "NVML not used (pynvml not installed: pip install 'hwpool[nvml]')", ()
    with _lock:
        cached = _answers.get(id(nvml))
        if cached is None or cached[0] is not nvml:
            cached = (nvml, *_ask(nvml))
            _answers[id(nvml)] = cached
    return cached[1], cached[2], cached[3]


def _ask(nvml: Any) -> tuple[tuple[GPUInfo, ...] | None, str, Failed]:
    try:
        nvml.nvmlInit()
    except Exception as exc:  # any failure of an optional library falls back to nvidia-smi
        return None, f"NVML failed at init ({nvml_why(exc)})", ()
    failed: list[tuple[str, str]] = []
    try:
        count, devices = _devices(nvml, failed)
    except Exception as exc:
        return None, f"NVML failed ({nvml_why(exc)})", ()
    finally:
        with contextlib.suppress(Exception):  # nothing to undo: the answer stands
            nvml.nvmlShutdown()
    migs = sum(d.is_mig for d in devices)
    parents = len({d.parent for d in devices if d.parent})
    outcome = f"NVML listed {count} GPU{'s' if count != 1 else ''}"
    outcome += f", {migs} MIG instances on {parents} of them" if migs else ""
    outcome += "".join(f"; left out {device} ({why})" for device, why in failed)
    return devices, outcome, tuple(failed)


def nvml_why(exc: BaseException) -> str:
    """An NVML error in words: ``NVMLError_GpuIsLost: GPU is lost``."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def nvml_code(exc: BaseException) -> int | None:
    """The ``NVML_ERROR_*`` code of ``exc`` (pynvml's ``value``, else from its class name)."""
    value = getattr(exc, "value", None)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _CODES.get(type(exc).__name__)


def _devices(nvml: Any, failed: list[tuple[str, str]]) -> tuple[int, tuple[GPUInfo, ...]]:
    """How many physical GPUs NVML counts, and the devices: MIG instances in their place. A
    GPU that fails is named in ``failed`` and left out."""
    devices: list[GPUInfo] = []
    count = int(nvml.nvmlDeviceGetCount())
    for i in range(count):
        try:
            found = _gpu(nvml, i)
        except Exception as exc:  # this GPU only: NVML answers for each device apart
            failed.append((f"device {i}", nvml_why(exc)))
            continue
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


def _gpu(nvml: Any, index: int) -> list[GPUInfo]:
    """GPU ``index``, or its MIG instances; the parent's memory is not read where it has
    instances (as non-root NVML refuses it: NVML_ERROR_NO_PERMISSION)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    migs = _mig_handles(nvml, handle)
    if not migs:
        return [_info(nvml, handle, str(index), None)]
    parent = nvml_text(nvml.nvmlDeviceGetUUID(handle))
    return [_mig_info(nvml, h, parent) for h in migs]


def _info(nvml: Any, handle: object, index: str, parent: str | None) -> GPUInfo:
    uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
    name = nvml_text(nvml.nvmlDeviceGetName(handle))
    memory = read_memory(nvml, handle)
    return GPUInfo(0, index or uuid, uuid, memory.total, name, parent, memory.used, memory.reserved)


class Memory(NamedTuple):
    """A device's memory in MiB: total (rounded down), used and reserved (rounded up); each
    None where NVML cannot say."""

    total: int | None
    used: int | None
    reserved: int | None


def read_memory(nvml: Any, handle: object) -> Memory:
    """``handle``'s memory: ``nvmlDeviceGetMemoryInfo_v2`` where it exists, else the original.

    ``used`` is what neither the free nor the reserved memory holds (total - free -
    reserved), so that it means the same whichever way a driver fills the v2 record's
    ``used`` (documentation before R590 says it includes ``reserved``); with the original
    record it is its ``used``, which counts the reserved memory in. NotSupported (unified
    memory) is all None; any other failure raises.
    """
    try:
        record = _memory_record(nvml, handle)
    except Exception as exc:
        if nvml_code(exc) == NVML_ERROR_NOT_SUPPORTED:
            return Memory(None, None, None)
        raise
    total, free, reserved = (_bytes(record, name) for name in ("total", "free", "reserved"))
    used = _bytes(record, "used")
    if total is not None and free is not None and reserved is not None:
        used = max(0, total - free - reserved)
    return Memory(
        None if total is None else total // _MIB,  # rounded down: never more than there is
        _mib_up(used),
        _mib_up(reserved),
    )


def _memory_record(nvml: Any, handle: object) -> object:
    """The v2 memory record, else the original one: where the driver lacks the v2 entry
    point (FunctionNotFound), nvidia-ml-py lacks the version argument (TypeError), or the v2
    call fails otherwise (an argument version mismatch, a device that refuses it), the
    original call is asked, and its failure is the one that counts."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
    return nvml.nvmlDeviceGetMemoryInfo(handle)


def _bytes(record: object, name: str) -> int | None:
    value = getattr(record, name, None)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return None
    return value


def _mib_up(count: int | None) -> int | None:
    """Bytes in MiB rounded up: never less than is in use; None if unknown."""
    return None if count is None else -(-count // _MIB)


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
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            devices = [handle, *_mig_handles(nvml, handle)]
        except Exception:  # a lost GPU: its use is unknown, the others' are read
            continue
        for device in devices:
            with contextlib.suppress(Exception):
                used[nvml_text(nvml.nvmlDeviceGetUUID(device))] = _read_used(nvml, device)
    return used


def _read_used(nvml: Any, handle: object) -> int | None:
    """One device's memory in use; None where NVML will not say (an instance, say)."""
    try:
        return read_memory(nvml, handle).used
    except Exception:
        return None


def nvml_devices(
    nvml: Any, failed: list[tuple[str, str]] | None = None
) -> list[tuple[str, object, bool]]:
    """Every device as CUDA sees it: its UUID, its NVML handle and whether it is a MIG
    instance; a MIG-enabled GPU's instances stand in its place, as in detection. NVML must be
    initialised. With ``failed``, a GPU whose handle or UUID fails is named there (``GPU 2``,
    NVML's error) and left out; without, and for ``nvmlDeviceGetCount``, raises what NVML
    raises (the watcher turns that into an unknown sample)."""
    devices: list[tuple[str, object, bool]] = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            migs = _mig_handles(nvml, handle)
            found = [
                (nvml_text(nvml.nvmlDeviceGetUUID(d)), d, bool(migs)) for d in migs or [handle]
            ]
        except Exception as exc:
            if failed is None:
                raise
            failed.append((f"device {i}", nvml_why(exc)))
            continue
        devices += found
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
