"""GPUs as ``nvidia-smi`` lists them: the CSV query for whole GPUs, ``-L`` for MIG instances.

``--query-gpu`` lists physical GPUs only; ``nvidia-smi -L`` also lists the MIG instances under
each, with their UUIDs and profiles (``3g.40gb``). A GPU with MIG instances is replaced by
them, each a GPU of its own size. nvidia-smi gives no instance's exact memory: it is read from
the profile name as GB (10**9 bytes) rounded down to MiB, which is never more than the
instance has (a ``3g.40gb`` instance is 38,146 MiB here; NVML reports its exact total).

``memory.used`` is per physical GPU: a MIG instance's use is unknown here (None). A field that
nvidia-smi cannot fill (``[N/A]``, ``[Not Supported]``) is None; anything else that is not an
integer makes the whole answer malformed.
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

__all__ = [
    "NVIDIA_SMI_IN_USE",
    "NVIDIA_SMI_LIST",
    "NVIDIA_SMI_QUERY",
    "query_nvidia_smi",
    "run_nvidia_smi",
    "smi_memory_in_use",
    "smi_number",
]

NVIDIA_SMI_QUERY = (
    "--query-gpu=index,uuid,name,memory.total,memory.used",
    "--format=csv,noheader,nounits",
)
NVIDIA_SMI_LIST = ("-L",)
NVIDIA_SMI_IN_USE = ("--query-gpu=uuid,memory.used", "--format=csv,noheader,nounits")

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


def run_nvidia_smi(args: tuple[str, ...], timeout: float) -> tuple[str | None, str]:
    """nvidia-smi's stdout for ``args`` (uncached), or None and what went wrong, in words."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi not found on PATH"
    return _run(exe, args, timeout)


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
_NOT_AVAILABLE = re.compile(r"\[[A-Za-z][A-Za-z /]*\]")  # [N/A], [Not Supported], [Unknown Error]
_MALFORMED = -1


def _parse_query(output: str) -> tuple[GPUInfo, ...] | None:
    """Parse ``index, uuid, name, memory.total, memory.used`` lines; None if any is malformed.

    A name may hold commas: it is everything between the UUID and the two memory fields.
    """
    gpus: list[GPUInfo] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5 or not _ASCII_INDEX.fullmatch(fields[0]) or not fields[1]:
            return None
        total, used = _mib(fields[-2]), _mib(fields[-1])
        if _MALFORMED in (total, used):
            return None
        name = ", ".join(fields[2:-2]) or None
        gpus.append(GPUInfo(len(gpus), fields[0], fields[1], total, name, None, used))
    return tuple(gpus)


def _mib(field: str) -> int | None:
    """A MiB field: its value, None for a marker such as ``[N/A]``, else ``_MALFORMED``."""
    if _ASCII_INDEX.fullmatch(field):
        return int(field)
    return None if _NOT_AVAILABLE.fullmatch(field) else _MALFORMED


def smi_number(field: str) -> int | None:
    """A whole-number CSV field (MiB, a percentage): its value, None for a marker such as
    ``[N/A]``; ValueError naming the field for anything else."""
    value = _mib(field.strip())
    if value == _MALFORMED:
        raise ValueError(
            f"nvidia-smi field must be a whole number or a marker such as [N/A], got {field!r}"
        )
    return value


def smi_memory_in_use(timeout: float) -> dict[str, int | None] | None:
    """The memory in use now (MiB) on each physical GPU nvidia-smi lists, by UUID; None on
    any failure (missing, exit status, timeout, output other than the queried CSV).

    Not cached: each call runs nvidia-smi anew. MIG instances are not listed (see above).
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    output, _failure = _run(exe, NVIDIA_SMI_IN_USE, timeout)
    return None if output is None else _parse_in_use(output)


def _parse_in_use(output: str) -> dict[str, int | None] | None:
    """Parse ``uuid, memory.used`` lines; None if any line is malformed."""
    used: dict[str, int | None] = {}
    for line in filter(str.strip, output.splitlines()):
        fields = [f.strip() for f in line.split(",")]
        mib = _mib(fields[-1])
        if len(fields) != 2 or not fields[0] or mib == _MALFORMED:
            return None
        used[fields[0]] = mib
    return used


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
