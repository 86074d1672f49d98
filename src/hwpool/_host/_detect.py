"""GPU detection: which GPUs this process may use, what they are, and where that came from.

Sources, first answer wins: ``HWPOOL_NUM_GPUS``; ``CUDA_VISIBLE_DEVICES``; NVML (when
``nvidia-ml-py`` is installed); ``nvidia-smi``; else one logical GPU, so that code written for
GPUs still runs on a laptop. MIG instances are GPUs of their own size (see ``_smi``, ``_nvml``).
:func:`gpu_memory_in_use` reads again only the memory in use, from the same sources.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._check import check_timeout, env_int
from ._cuda import cuda_devices
from ._devices import GPUInfo
from ._nvml import nvml_memory_in_use, query_nvml
from ._smi import query_nvidia_smi, smi_memory_in_use
from ._visible import ORDER_VAR, VISIBLE_VAR, read_visible

__all__ = ["GPUDetection", "GPUInfo", "GPUSource", "detect_gpus", "gpu_memory_in_use"]

NUM_GPUS_VAR = "HWPOOL_NUM_GPUS"
NVIDIA_SMI_TIMEOUT_S = 5.0


class GPUSource(enum.StrEnum):
    """Where a GPU count came from."""

    ENV = "env"
    CUDA_VISIBLE_DEVICES = "cuda_visible_devices"
    NVML = "nvml"
    NVIDIA_SMI = "nvidia-smi"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class GPUDetection:
    """The result of :func:`detect_gpus`: ``count`` GPUs found through ``source``.

    ``detail`` says where the answer came from, in words; ``nvidia_smi`` what happened when
    nvidia-smi was asked ("nvidia-smi timed out after 5 s", "nvidia-smi exited 9", "nvidia-smi
    not found on PATH", "nvidia-smi exited 18: Failed to initialize NVML: ...": its own
    words), ``nvml`` the same for NVML ("NVML failed at init (...)"); each is None when that
    source was not asked. ``failed`` names each GPU the answering source could not read, with
    its error (``("device 1", "NVMLError_GpuIsLost: GPU is lost")``, by NVML's index, or
    nvidia-smi's ``GPU 0000:82:00.0``): it is left out of ``gpus``, and the others are used.
    """

    count: int
    source: GPUSource
    gpus: tuple[GPUInfo, ...]
    detail: str = ""
    nvidia_smi: str | None = None
    nvml: str | None = None
    failed: tuple[tuple[str, str], ...] = ()


def detect_gpus(
    environ: Mapping[str, str] | None = None,
    *,
    nvidia_smi_timeout: float = NVIDIA_SMI_TIMEOUT_S,
    describe: bool = False,
) -> GPUDetection:
    """Find the GPUs this process may use; see the module docstring for the order.

    ``HWPOOL_NUM_GPUS`` must be an integer >= 1 in ASCII digits (else ValueError naming the
    variable); it decides alone. ``CUDA_VISIBLE_DEVICES`` is read as CUDA reads it (see
    ``hwpool._host._visible`` and docs/gpus.md): ``""``, ``-1`` or ``NoDevFiles`` is no GPU
    (``count`` 0, ``detail`` says why), the list ends at its first invalid entry (an index
    this machine does not have, a UUID that names no GPU or several), one MIG device at most.
    Entries are checked against what NVML or nvidia-smi found, which gives each its UUID,
    memory and name (taken as given, unchecked, when neither answers). Indexes with
    ``CUDA_DEVICE_ORDER`` unset on GPUs that differ are numbered by the CUDA driver itself,
    asked in a child process; ValueError naming ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` when it
    cannot be asked. ``describe`` is kept for compatibility: the hardware is always asked.
    NVML is tried first where ``pynvml`` imports; if it fails, nvidia-smi is asked and ``nvml``
    says why. nvidia-smi failures of any kind (missing, non-zero exit, garbage, timeout) fall
    through, and ``nvidia_smi`` says which it was. Both answers are cached for the process: a
    hung nvidia-smi costs its timeout once.
    """
    env = os.environ if environ is None else environ
    forced = env_int(NUM_GPUS_VAR, env, minimum=1)
    if forced is not None:
        gpus = tuple(GPUInfo(i, str(i)) for i in range(forced))
        return GPUDetection(forced, GPUSource.ENV, gpus, f"{NUM_GPUS_VAR}={forced}")
    visible = env.get(VISIBLE_VAR)
    if visible is not None:
        return _visible(env, visible, nvidia_smi_timeout)
    found, source, smi, nvml, lost = _hardware(nvidia_smi_timeout)
    failed = nvml if nvml.startswith("NVML failed") else None
    if found:
        detail = (
            f"{source} ({failed})" if failed and source is GPUSource.NVIDIA_SMI else str(source)
        )
        return GPUDetection(len(found), source, found, detail, smi, nvml, lost)
    outcome = "; ".join(o for o in (failed, smi) if o)
    return GPUDetection(
        1,
        GPUSource.DEFAULT,
        (GPUInfo(0, "0"),),
        f"no GPU found ({outcome}): 1 logical GPU",
        smi,
        nvml,
        lost,
    )


def _visible(env: Mapping[str, str], visible: str, timeout: float) -> GPUDetection:
    detail = f"{VISIBLE_VAR}={visible!r}"
    unchecked, note = read_visible(visible, None, None, _unasked)
    if not unchecked:  # nothing the hardware could add: no need to ask it
        detail += f": {note}; no GPU visible"
        return GPUDetection(0, GPUSource.CUDA_VISIBLE_DEVICES, (), detail)
    found, source, smi, nvml, lost = _hardware(timeout)
    order = env.get(ORDER_VAR)
    gpus, note = read_visible(visible, found or None, order, lambda: cuda_devices(env))
    known = sum(g.uuid is not None for g in gpus)
    detail += f", {known} of {len(gpus)} matched through {source}" if found else ""
    detail += f"; {note}" if note else ""
    detail += "" if gpus else "; no GPU visible"
    return GPUDetection(len(gpus), GPUSource.CUDA_VISIBLE_DEVICES, gpus, detail, smi, nvml, lost)


def _unasked() -> tuple[tuple[str, ...] | None, str]:
    raise AssertionError("the CUDA driver is asked only about detected GPUs")


def _hardware(
    timeout: float,
) -> tuple[tuple[GPUInfo, ...], GPUSource, str | None, str, tuple[tuple[str, str], ...]]:
    """What NVML, else nvidia-smi, found; the source; nvidia-smi's and NVML's outcomes; the
    GPUs the answering source named as failed."""
    found, nvml, lost = query_nvml()
    if found:
        return found, GPUSource.NVML, None, nvml, lost
    devices, smi, failed = query_nvidia_smi(timeout)
    return devices, GPUSource.NVIDIA_SMI, smi, nvml, failed if devices else failed or lost


def gpu_memory_in_use(
    gpus: Sequence[GPUInfo], *, nvidia_smi_timeout: float = NVIDIA_SMI_TIMEOUT_S
) -> tuple[int | None, ...]:
    """The memory in use now on each of ``gpus`` (MiB, rounded up, by any process), read anew.

    NVML where it imports and initialises, else nvidia-smi (``memory.used``); a GPU is found by
    its ``uuid``, so that ``CUDA_VISIBLE_DEVICES`` renumbering does not matter. None for a GPU
    without a UUID (a logical one), one neither source could read (nvidia-smi: any MIG
    instance) or when neither works: this never raises for want of a source, so that a status
    line can always be printed. Nothing is cached. TypeError if ``gpus`` holds other than
    :class:`GPUInfo`; ValueError unless ``nvidia_smi_timeout`` is a finite number > 0.
    """
    listed = tuple(gpus)
    for i, gpu in enumerate(listed):
        if not isinstance(gpu, GPUInfo):
            raise TypeError(f"gpus[{i}] must be a GPUInfo (from detect_gpus), got {gpu!r}")
    timeout = check_timeout(nvidia_smi_timeout, "nvidia_smi_timeout")
    if not timeout:  # None or 0: a status line must not hang, nor give up before asking
        raise ValueError(f"nvidia_smi_timeout must be a number > 0, got {nvidia_smi_timeout!r}")
    readings = nvml_memory_in_use()
    if readings is None:
        readings = smi_memory_in_use(timeout)
    found = readings or {}
    return tuple(None if gpu.uuid is None else found.get(gpu.uuid) for gpu in listed)
