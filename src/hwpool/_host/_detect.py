"""GPU detection: how many GPUs this process may use, and where that number came from.

Sources, first answer wins: ``HWPOOL_NUM_GPUS``; ``CUDA_VISIBLE_DEVICES``; ``nvidia-smi``;
else one logical GPU, so that code written for GPUs still runs on a laptop.
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from .._check import env_int

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
    """The result of :func:`detect_gpus`: ``count`` GPUs found through ``source``.

    ``detail`` says where the answer came from, in words; ``nvidia_smi`` what happened when
    nvidia-smi was asked ("nvidia-smi timed out after 5 s", "nvidia-smi exited 9", "nvidia-smi
    not found on PATH", ...), or None when an environment variable decided first.
    """

    count: int
    source: GPUSource
    gpus: tuple[GPUInfo, ...]
    detail: str = ""
    nvidia_smi: str | None = None


def detect_gpus(
    environ: Mapping[str, str] | None = None, *, nvidia_smi_timeout: float = NVIDIA_SMI_TIMEOUT_S
) -> GPUDetection:
    """Find the GPUs this process may use; see the module docstring for the order.

    ``HWPOOL_NUM_GPUS`` must be an integer >= 1 in ASCII digits (else ValueError naming the
    variable). ``CUDA_VISIBLE_DEVICES`` lists indices, UUIDs (``GPU-...``) or MIG ids; as in
    CUDA, the list ends at the first entry that is none of these (``""``, ``-1``, ``foo``:
    no GPU visible). nvidia-smi failures of any kind (missing, non-zero exit, garbage,
    timeout) fall through, and ``nvidia_smi`` says which it was. nvidia-smi's answer is
    cached for the process: a hung nvidia-smi costs its timeout once.
    """
    env = os.environ if environ is None else environ
    forced = env_int(NUM_GPUS_VAR, env, minimum=1)
    if forced is not None:
        gpus = tuple(GPUInfo(i, str(i)) for i in range(forced))
        return GPUDetection(forced, GPUSource.ENV, gpus, f"{NUM_GPUS_VAR}={forced}")
    visible = env.get(VISIBLE_VAR)
    if visible is not None:
        ids = _parse_visible_devices(visible)
        gpus = tuple(GPUInfo(i, device) for i, device in enumerate(ids))
        return GPUDetection(
            len(ids), GPUSource.CUDA_VISIBLE_DEVICES, gpus, f"{VISIBLE_VAR}={visible!r}"
        )
    found, outcome = _query_nvidia_smi(nvidia_smi_timeout)
    if found:
        return GPUDetection(len(found), GPUSource.NVIDIA_SMI, found, "nvidia-smi", outcome)
    return GPUDetection(
        1,
        GPUSource.DEFAULT,
        (GPUInfo(0, "0"),),
        f"no GPU found ({outcome}): 1 logical GPU",
        outcome,
    )


_DEVICE = re.compile(r"[0-9]+|(GPU|MIG)-[0-9A-Za-z-]+")


def _parse_visible_devices(raw: str) -> list[str]:
    """Split CUDA_VISIBLE_DEVICES; like CUDA, stop at the first entry that is not an index,
    a ``GPU-`` UUID or a ``MIG-`` id (``-1``, an empty entry, ``foo``)."""
    ids: list[str] = []
    for part in raw.split(","):
        device = part.strip()
        if not _DEVICE.fullmatch(device):
            break
        ids.append(device)
    return ids


_smi_lock = threading.Lock()
_smi_answers: dict[tuple[object, ...], tuple[tuple[GPUInfo, ...], str]] = {}


def _query_nvidia_smi(timeout: float) -> tuple[tuple[GPUInfo, ...], str]:
    """The GPUs nvidia-smi lists (empty on any failure) and what happened, in words.

    Cached per process, keyed by the binary (path and file identity) and the timeout, so that
    another nvidia-smi on PATH (or a new one installed) is asked afresh.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (), "nvidia-smi not found on PATH"
    try:
        info = os.stat(exe)
    except OSError as exc:
        return (), f"nvidia-smi could not be read: {exc.strerror}"
    key = (exe, info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, timeout)
    with _smi_lock:
        if key not in _smi_answers:
            _smi_answers[key] = _ask_nvidia_smi(exe, timeout)
        return _smi_answers[key]


def _ask_nvidia_smi(exe: str, timeout: float) -> tuple[tuple[GPUInfo, ...], str]:
    try:
        proc = _run_with_timeout([exe, *NVIDIA_SMI_QUERY], timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return (), f"nvidia-smi could not run: {exc}"
    if proc is None:
        return (), f"nvidia-smi timed out after {timeout:g} s"
    code, output = proc
    if code < 0:
        return (), f"nvidia-smi was killed by signal {-code}"
    if code != 0:
        return (), f"nvidia-smi exited {code}"
    gpus = _parse_nvidia_smi(output)
    if gpus is None:
        return (), "nvidia-smi printed something other than the queried CSV"
    if not gpus:
        return (), "nvidia-smi listed no GPU"
    return gpus, f"nvidia-smi listed {len(gpus)} GPU{'s' if len(gpus) > 1 else ''}"


def _run_with_timeout(argv: list[str], timeout: float) -> tuple[int, str] | None:
    """Exit status and stdout of ``argv``, or None if it ran past ``timeout``; its whole
    process group is killed on timeout so that a stuck child cannot hold the pipe open."""
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
    return proc.returncode, out


def _parse_nvidia_smi(output: str) -> tuple[GPUInfo, ...] | None:
    """Parse ``index, uuid, memory.total`` lines; None if any line is malformed."""
    gpus: list[GPUInfo] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not _ASCII_INDEX.fullmatch(fields[0]) or not fields[1]:
            return None
        memory = int(fields[2]) if _ASCII_INDEX.fullmatch(fields[2]) else None
        gpus.append(GPUInfo(len(gpus), fields[0], fields[1], memory))
    return tuple(gpus)


_ASCII_INDEX = re.compile(r"[0-9]+")
