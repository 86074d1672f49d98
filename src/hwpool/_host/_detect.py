"""GPU detection: how many GPUs this process may use, and where that number came from.

Sources, first answer wins: ``HWPOOL_NUM_GPUS``; ``CUDA_VISIBLE_DEVICES``; ``nvidia-smi``;
else one logical GPU, so that code written for GPUs still runs on a laptop.
"""

from __future__ import annotations

import enum
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["GPUDetection", "GPUInfo", "GPUSource", "detect_gpus"]

NUM_GPUS_VAR = "HWPOOL_NUM_GPUS"
VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"
NVIDIA_SMI_QUERY = ("--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits")
NVIDIA_SMI_TIMEOUT_S = 5.0


class GPUSource(enum.StrEnum):
    """Where a GPU count came from."""

    ENV = "env"
    CUDA_VISIBLE_DEVICES = "cuda_visible_devices"
    NVIDIA_SMI = "nvidia-smi"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """One GPU: its logical index in the pool and what is known of the device behind it.

    ``device_id`` is what to put in ``CUDA_VISIBLE_DEVICES`` to select this device (a physical
    index, a UUID or a MIG id); ``uuid`` and ``memory_mib`` come from nvidia-smi when it ran.
    """

    index: int
    device_id: str
    uuid: str | None = None
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class GPUDetection:
    """The result of :func:`detect_gpus`: ``count`` GPUs found through ``source``."""

    count: int
    source: GPUSource
    gpus: tuple[GPUInfo, ...]
    detail: str = ""


def detect_gpus(
    environ: Mapping[str, str] | None = None, *, nvidia_smi_timeout: float = NVIDIA_SMI_TIMEOUT_S
) -> GPUDetection:
    """Find the GPUs this process may use; see the module docstring for the order.

    ``HWPOOL_NUM_GPUS`` must be an integer >= 1 (else ValueError naming the variable).
    ``CUDA_VISIBLE_DEVICES`` of ``""`` or ``-1`` means no GPU is visible (count 0).
    nvidia-smi failures of any kind (missing, non-zero exit, garbage, timeout) fall through.
    """
    env = os.environ if environ is None else environ
    forced = env.get(NUM_GPUS_VAR)
    if forced is not None:
        count = _parse_num_gpus(forced)
        gpus = tuple(GPUInfo(i, str(i)) for i in range(count))
        return GPUDetection(count, GPUSource.ENV, gpus, f"{NUM_GPUS_VAR}={forced}")
    visible = env.get(VISIBLE_VAR)
    if visible is not None:
        ids = _parse_visible_devices(visible)
        gpus = tuple(GPUInfo(i, device) for i, device in enumerate(ids))
        return GPUDetection(
            len(ids), GPUSource.CUDA_VISIBLE_DEVICES, gpus, f"{VISIBLE_VAR}={visible!r}"
        )
    found = _query_nvidia_smi(nvidia_smi_timeout)
    if found:
        return GPUDetection(len(found), GPUSource.NVIDIA_SMI, found, "nvidia-smi")
    return GPUDetection(1, GPUSource.DEFAULT, (GPUInfo(0, "0"),), "no GPU found: 1 logical GPU")


def _parse_num_gpus(raw: str) -> int:
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{NUM_GPUS_VAR} must be an integer >= 1, got {raw!r}")
    return int(text)


def _parse_visible_devices(raw: str) -> list[str]:
    """Split CUDA_VISIBLE_DEVICES; like CUDA, stop at the first ``-1`` or empty entry."""
    ids: list[str] = []
    for part in raw.split(","):
        device = part.strip()
        if not device or device == "-1" or device.startswith("-"):
            break
        ids.append(device)
    return ids


def _query_nvidia_smi(timeout: float) -> tuple[GPUInfo, ...]:
    """Run nvidia-smi and parse its CSV; an empty tuple on any failure."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        output = _run_with_timeout([exe, *NVIDIA_SMI_QUERY], timeout)
    except (OSError, subprocess.SubprocessError):
        return ()
    return _parse_nvidia_smi(output) if output is not None else ()


def _run_with_timeout(argv: list[str], timeout: float) -> str | None:
    """Stdout of ``argv`` if it exits 0 within ``timeout``; its whole process group is killed
    on timeout so that a stuck child cannot hold the pipe open."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):
            proc.kill()
        proc.communicate()
        return None
    return out if proc.returncode == 0 else None


def _parse_nvidia_smi(output: str) -> tuple[GPUInfo, ...]:
    """Parse ``index, uuid, memory.total`` lines; any malformed line rejects the whole output."""
    gpus: list[GPUInfo] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[0].isdigit() or not fields[1]:
            return ()
        memory = int(fields[2]) if fields[2].isdigit() else None
        gpus.append(GPUInfo(len(gpus), fields[0], fields[1], memory))
    return tuple(gpus)
