"""GPUs as ``nvidia-smi`` lists them: the CSV query for whole GPUs, ``-L`` for MIG instances.

``--query-gpu`` lists physical GPUs only; ``nvidia-smi -L`` also lists the MIG instances under
each, with their UUIDs and profiles (``3g.40gb``). A GPU with MIG instances is replaced by
them, each a GPU of its own size. nvidia-smi gives no instance's exact memory: it is read from
the profile name as GB (10**9 bytes) rounded down to MiB, which is never more than the
instance has (a ``3g.40gb`` instance is 38,146 MiB here; NVML reports its exact total).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import replace

from ._devices import GPUInfo

__all__ = ["NVIDIA_SMI_LIST", "NVIDIA_SMI_QUERY", "query_nvidia_smi"]

NVIDIA_SMI_QUERY = ("--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits")
NVIDIA_SMI_LIST = ("-L",)

_lock = threading.Lock()
_answers: dict[tuple[object, ...], tuple[tuple[GPUInfo, ...], str]] = {}


def query_nvidia_smi(timeout: float) -> tuple[tuple[GPUInfo, ...], str]:
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
    with _lock:
        if key not in _answers:
            _answers[key] = _ask(exe, timeout)
        return _answers[key]


def _ask(exe: str, timeout: float) -> tuple[tuple[GPUInfo, ...], str]:
    output, failure = _run(exe, NVIDIA_SMI_QUERY, timeout)
    if output is None:
        return (), failure
    gpus = _parse_query(output)
    if gpus is None:
        return (), "nvidia-smi printed something other than the queried CSV"
    if not gpus:
        return (), "nvidia-smi listed no GPU"
    listing, failure = _run(exe, NVIDIA_SMI_LIST, timeout)
    migs = _parse_list(listing or "")
    devices = _with_mig(gpus, migs)
    outcome = f"nvidia-smi listed {_gpus(len(gpus))}"
    if migs:
        outcome += f", {_mig_count(migs)} on {len(migs)} of them"
    if listing is None:
        outcome += f"; nvidia-smi -L: {failure}, so no MIG instance is known"
    return devices, outcome


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _mig_count(migs: dict[str, list[GPUInfo]]) -> str:
    n = sum(len(v) for v in migs.values())
    return f"{n} MIG instance{'s' if n != 1 else ''}"


def _run(exe: str, args: tuple[str, ...], timeout: float) -> tuple[str | None, str]:
    """nvidia-smi's stdout for ``args``, or None and what went wrong, in words."""
    try:
        proc = _run_with_timeout([exe, *args], timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nvidia-smi could not run: {exc}"
    if proc is None:
        return None, f"nvidia-smi timed out after {timeout:g} s"
    code, output = proc
    if code < 0:
        return None, f"nvidia-smi was killed by signal {-code}"
    if code != 0:
        return None, f"nvidia-smi exited {code}"
    return output, ""


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


_ASCII_INDEX = re.compile(r"[0-9]+")


def _parse_query(output: str) -> tuple[GPUInfo, ...] | None:
    """Parse ``index, uuid, name, memory.total`` lines; None if any line is malformed.

    A name may hold commas: it is everything between the UUID and the last field.
    """
    gpus: list[GPUInfo] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or not _ASCII_INDEX.fullmatch(fields[0]) or not fields[1]:
            return None
        memory = int(fields[-1]) if _ASCII_INDEX.fullmatch(fields[-1]) else None
        name = ", ".join(fields[2:-1]) or None
        gpus.append(GPUInfo(len(gpus), fields[0], fields[1], memory, name))
    return tuple(gpus)


_GPU_LINE = re.compile(r"GPU\s+([0-9]+):.*\(UUID:\s*(GPU-[^\s)]+)\)\s*")
_MIG_LINE = re.compile(r"\s+MIG\s+(\S+)\s+Device\s+([0-9]+):\s*\(UUID:\s*(MIG-[^\s)]+)\)\s*")
_PROFILE_GB = re.compile(r"(?:[0-9]+c\.)?[0-9]+g\.([0-9]+)gb(?:\+\w+)*")


def _parse_list(output: str) -> dict[str, list[GPUInfo]]:
    """MIG instances in ``nvidia-smi -L`` output, by the UUID of their parent GPU.

    Lines that are neither a GPU nor a MIG line are skipped: this is only ever an addition to
    what the CSV query found.
    """
    migs: dict[str, list[GPUInfo]] = {}
    parent: str | None = None
    for line in output.splitlines():
        if gpu := _GPU_LINE.fullmatch(line):
            parent = gpu.group(2)
        elif (mig := _MIG_LINE.fullmatch(line)) and parent is not None:
            profile, uuid = mig.group(1), mig.group(3)
            size = _PROFILE_GB.fullmatch(profile)
            memory = int(size.group(1)) * 10**9 // 2**20 if size else None
            migs.setdefault(parent, []).append(GPUInfo(0, uuid, uuid, memory, profile, parent))
    return migs


def _with_mig(gpus: tuple[GPUInfo, ...], migs: dict[str, list[GPUInfo]]) -> tuple[GPUInfo, ...]:
    """``gpus`` with each MIG-partitioned GPU replaced by its instances, renumbered."""
    devices: list[GPUInfo] = []
    for gpu in gpus:
        for device in migs.get(gpu.uuid or "", [gpu]):
            name = f"{gpu.name} MIG {device.name}" if device.is_mig and gpu.name else device.name
            devices.append(replace(device, index=len(devices), name=name))
    return tuple(devices)
