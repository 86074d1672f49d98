"""GPUs as ``nvidia-smi`` lists them: the CSV query for whole GPUs, ``-L`` and the default
table for MIG devices.

``--query-gpu`` lists physical GPUs only; ``nvidia-smi -L`` also lists the MIG devices under
each, with their UUIDs, profiles (``3g.40gb``) and device numbers. A GPU with MIG devices is
replaced by them. Their memory comes from the "MIG devices" section of the default table
(``nvidia-smi`` with no arguments), where each row gives a device's GPU instance (GI),
compute instance (CI), device number and the memory of its GPU instance, used and total, in
MiB as the driver reports it: never from the profile name, which rounds (``1g.18gb`` is
16384 MiB on an H200). Compute instances of one GPU instance share its memory, so they get
one ``memory_group``. Where the table cannot be read, a MIG device's memory is unknown (None).

``memory.used`` of a whole GPU comes from the CSV query. A field that nvidia-smi cannot fill
(``[N/A]``, ``[Not Supported]``) is None; anything else that is not an integer makes the whole
answer malformed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import replace

from ._devices import GPUInfo, memory_group

__all__ = [
    "NVIDIA_SMI_IN_USE",
    "NVIDIA_SMI_LIST",
    "NVIDIA_SMI_QUERY",
    "NVIDIA_SMI_TABLE",
    "parse_mig_list",
    "parse_mig_table",
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
NVIDIA_SMI_TABLE: tuple[str, ...] = ()  # the default table, for its "MIG devices" section
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
    migs = parse_mig_list(listing or "")
    outcome = f"nvidia-smi listed {_gpus(len(gpus))}"
    if migs:
        outcome += f", {_mig_count(migs)} on {len(migs)} of them"
        table, why = _run(exe, NVIDIA_SMI_TABLE, timeout)
        sizes = parse_mig_table(table or "")
        migs = _sized_migs(migs, sizes)
        if not sizes:
            why = why or "no MIG devices section"
            outcome += f"; nvidia-smi's table: {why}, so their memory is unknown"
    if listing is None:
        outcome += f"; nvidia-smi -L: {failure}, so no MIG instance is known"
    return _with_mig(gpus, migs), outcome


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
_MIG_ROW = re.compile(
    r"\|\s*([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)\s*\|\s*(?:([0-9]+)MiB|N/A)\s*/\s*([0-9]+)MiB\b.*"
)


def parse_mig_list(output: str) -> dict[str, list[GPUInfo]]:
    """MIG devices in ``nvidia-smi -L`` output, by the UUID of their parent GPU, each with
    its device number (``Device 3``) as ``device_id`` and its parent's GPU number as
    ``index`` (what the default table names them by) until :func:`_sized_migs` renames it.

    Lines that are neither a GPU nor a MIG line are skipped: this is only ever an addition to
    what the CSV query found. No memory is read from the profile name (see the module doc).
    """
    migs: dict[str, list[GPUInfo]] = {}
    parent: str | None = None
    index = 0
    for line in output.splitlines():
        if gpu := _GPU_LINE.fullmatch(line):
            index, parent = int(gpu.group(1)), gpu.group(2)
        elif (mig := _MIG_LINE.fullmatch(line)) and parent is not None:
            profile, number, uuid = mig.group(1), mig.group(2), mig.group(3)
            found = GPUInfo(index, number, uuid, None, profile, parent)
            migs.setdefault(parent, []).append(found)
    return migs


def parse_mig_table(output: str) -> dict[tuple[int, int], tuple[int, int, int | None, int]]:
    """The "MIG devices" section of nvidia-smi's default table: per (GPU index, MIG device
    number), its (GPU instance id, compute instance id, MiB used, MiB total) of the GPU
    instance's memory (used None where printed ``N/A``). Rows of other sections, and
    anything unreadable, are skipped."""
    found: dict[tuple[int, int], tuple[int, int, int | None, int]] = {}
    inside = False
    for line in output.splitlines():
        if "MIG devices:" in line:
            inside = True
        elif "Processes:" in line:
            inside = False
        elif inside and (row := _MIG_ROW.fullmatch(line.strip())):
            gpu, gi, ci, dev = (int(x) for x in row.groups()[:4])
            used = None if row.group(5) is None else int(row.group(5))
            found[gpu, dev] = (gi, ci, used, int(row.group(6)))
    return found


def _sized_migs(
    migs: dict[str, list[GPUInfo]],
    table: dict[tuple[int, int], tuple[int, int, int | None, int]],
) -> dict[str, list[GPUInfo]]:
    """``migs`` with each device's memory, memory in use and ``memory_group`` from ``table``
    (left unknown for a device the table does not list), and its UUID as ``device_id``."""
    sized: dict[str, list[GPUInfo]] = {}
    for parent, devices in migs.items():
        for device in devices:
            row = table.get((device.index, int(device.device_id)))
            found = replace(device, device_id=device.uuid or device.device_id)
            if row is not None:
                gi, _ci, used, total = row
                found = replace(found, memory_mib=total, memory_used_mib=used,
                                memory_group=memory_group(parent, gi))  # fmt: skip
            sized.setdefault(parent, []).append(found)
    return sized


def _with_mig(gpus: tuple[GPUInfo, ...], migs: dict[str, list[GPUInfo]]) -> tuple[GPUInfo, ...]:
    """``gpus`` with each MIG-partitioned GPU replaced by its instances, renumbered."""
    devices: list[GPUInfo] = []
    for gpu in gpus:
        for device in migs.get(gpu.uuid or "", [gpu]):
            name = f"{gpu.name} MIG {device.name}" if device.is_mig and gpu.name else device.name
            devices.append(replace(device, index=len(devices), name=name))
    return tuple(devices)
