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

``memory.used`` of a whole GPU comes from the CSV query, a MIG device's from the table.
``memory.reserved`` (what the driver and firmware keep) is asked for too; a driver that does
not know the field is asked again without it. A field that nvidia-smi cannot fill (``[N/A]``,
``[Not Supported]``) is None; anything else that is not an integer makes the whole answer
malformed.

A GPU nvidia-smi cannot reach is printed as ``Unable to determine the device handle for GPU
<bus id>: <why>`` among the others' rows: it is left out and named (``failed``), and the
rest are used. When nvidia-smi fails as a whole, its own first lines are the failure
("nvidia-smi exited 18: Failed to initialize NVML: Driver/library version mismatch").
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, replace

from ._devices import GPUInfo, memory_group

__all__ = [
    "NVIDIA_SMI_IN_USE",
    "NVIDIA_SMI_LIST",
    "NVIDIA_SMI_QUERY",
    "NVIDIA_SMI_TABLE",
    "SmiRows",
    "parse_mig_list",
    "parse_mig_table",
    "query_nvidia_smi",
    "run_nvidia_smi",
    "smi_memory_in_use",
    "smi_number",
    "smi_rows",
]

NVIDIA_SMI_QUERY = (
    "--query-gpu=index,uuid,name,memory.total,memory.used,memory.reserved",
    "--format=csv,noheader,nounits",
)
NVIDIA_SMI_QUERY_NO_RESERVED = (
    "--query-gpu=index,uuid,name,memory.total,memory.used",
    "--format=csv,noheader,nounits",
)
RESERVED_FIELD = "memory.reserved"
_MESSAGE_LINES = 2  # of nvidia-smi's own message, in a failure
_MESSAGE_CHARS = 300
NVIDIA_SMI_LIST = ("-L",)
NVIDIA_SMI_TABLE: tuple[str, ...] = ()  # the default table, for its "MIG devices" section
NVIDIA_SMI_IN_USE = ("--query-gpu=uuid,memory.used", "--format=csv,noheader,nounits")

_lock = threading.Lock()
Failed = tuple[tuple[str, str], ...]
"""Devices left out, each with why: ``(("GPU 0000:82:00.0", "GPU is lost. ..."),)``."""

_answers: dict[tuple[object, ...], tuple[tuple[GPUInfo, ...], str, Failed]] = {}


def query_nvidia_smi(timeout: float) -> tuple[tuple[GPUInfo, ...], str, Failed]:
    """The GPUs nvidia-smi lists (empty on any failure), what happened, in words, and the
    GPUs it could not reach, each with nvidia-smi's reason.

    Cached per process, keyed by the binary (path and file identity) and the timeout, so that
    another nvidia-smi on PATH (or a new one installed) is asked afresh.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (), "nvidia-smi not found on PATH", ()
    try:
        info = os.stat(exe)
    except OSError as exc:
        return (), f"nvidia-smi could not be read: {exc.strerror}", ()
    key = (exe, info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size, timeout)
    with _lock:
        if key not in _answers:
            _answers[key] = _ask(exe, timeout)
        return _answers[key]


def _ask(exe: str, timeout: float) -> tuple[tuple[GPUInfo, ...], str, Failed]:
    rows = smi_rows(exe, NVIDIA_SMI_QUERY, timeout)
    reserved = True
    if rows.output is None and f'"{RESERVED_FIELD}"' in rows.failure:  # an older driver
        rows, reserved = smi_rows(exe, NVIDIA_SMI_QUERY_NO_RESERVED, timeout), False
    if rows.output is None:
        return (), rows.failure, rows.failed
    gpus = _parse_query(rows.output, reserved)
    if gpus is None:
        return (), _other_than_csv(rows.output), rows.failed
    if not gpus:
        return (), "nvidia-smi listed no GPU" + _left_out(rows.failed), rows.failed
    listed = smi_rows(exe, NVIDIA_SMI_LIST, timeout)  # past a lost GPU too
    listing, failure = listed.output, listed.failure
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
    return _with_mig(gpus, migs), outcome + _left_out(rows.failed), rows.failed


def _left_out(failed: Failed) -> str:
    """``; left out GPU 0000:82:00.0 (GPU is lost)`` for the outcome; "" for none."""
    return "".join(f"; left out {device} ({why})" for device, why in failed)


def _other_than_csv(output: str) -> str:
    """The failure for output that is not the CSV asked for, with its first lines."""
    said = _message(output)
    return "nvidia-smi printed something other than the queried CSV" + (f": {said}" if said else "")


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


@dataclass(frozen=True)
class SmiRows:
    """A CSV query's answer: ``output``, the CSV lines (None when there are none to use),
    ``failed``, the GPUs nvidia-smi named as unreachable, and ``failure`` in words ("" when
    ``output`` is there)."""

    output: str | None
    failed: Failed
    failure: str


_HANDLE_FAILED = re.compile(
    r"Unable to determine the device handle for (GPU) ?([0-9A-Fa-f:.]+): (.*)"
)


def smi_rows(exe: str | None, args: tuple[str, ...], timeout: float) -> SmiRows:
    """Run a CSV query, keeping the rows of the GPUs that answered when another one failed.

    nvidia-smi prints ``Unable to determine the device handle for GPU <bus id>: <why>`` for a
    GPU it cannot reach (lost, unknown error, insufficient power); such a line names that
    GPU in ``failed``, and the other lines are the CSV, whatever the exit status. Without such
    a line, a non-zero exit is a failure with nvidia-smi's own first lines.
    """
    exe = exe or shutil.which("nvidia-smi")
    if exe is None:
        return SmiRows(None, (), "nvidia-smi not found on PATH")
    status, output, errors, failure = _execute(exe, args, timeout)
    if output is None:
        return SmiRows(None, (), failure)
    failed: list[tuple[str, str]] = []
    lines = [line for line in output.splitlines() if not _named_failed(line, failed)]
    for line in errors.splitlines():
        _named_failed(line, failed)
    if status != 0 and not failed:
        return SmiRows(None, (), failure)
    return SmiRows("".join(f"{line}\n" for line in lines), tuple(failed), "")


def _named_failed(line: str, failed: list[tuple[str, str]]) -> bool:
    """Whether ``line`` names a GPU nvidia-smi cannot reach; if so, added to ``failed``."""
    handle = _HANDLE_FAILED.fullmatch(line.strip())
    if handle:
        failed.append((f"{handle.group(1)} {handle.group(2)}", _message(handle.group(3))))
    return handle is not None


def _run(exe: str, args: tuple[str, ...], timeout: float) -> tuple[str | None, str]:
    """nvidia-smi's stdout for ``args``, or None and what went wrong, in words."""
    status, output, _errors, failure = _execute(exe, args, timeout)
    return (output, "") if status == 0 else (None, failure)


def _execute(
    exe: str, args: tuple[str, ...], timeout: float
) -> tuple[int | None, str | None, str, str]:
    """Exit status, stdout, stderr and, unless it exited 0, what went wrong in words (with
    nvidia-smi's own first lines: it prints its errors on stdout, some on stderr)."""
    try:
        proc = _run_with_timeout([exe, *args], timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, "", f"nvidia-smi could not run: {exc}"
    if proc is None:
        return None, None, "", f"nvidia-smi timed out after {timeout:g} s"
    code, output, errors = proc
    if code < 0:
        return code, output, errors, f"nvidia-smi was killed by signal {-code}"
    if code != 0:
        said = _message(output + "\n" + errors)
        return code, output, errors, f"nvidia-smi exited {code}" + (f": {said}" if said else "")
    return code, output, errors, ""


def _message(text: str) -> str:
    """nvidia-smi's own message: its first non-blank lines, joined, whitespace collapsed,
    anything unprintable (a terminal escape) shown as ``?``."""
    lines = [
        " ".join("".join(c if c.isprintable() else "?" for c in line).split())
        for line in text.splitlines()
        if line.strip()
    ]
    said = "; ".join(lines[:_MESSAGE_LINES])
    return said if len(said) <= _MESSAGE_CHARS else said[: _MESSAGE_CHARS - 3] + "..."


def _run_with_timeout(argv: list[str], timeout: float) -> tuple[int, str, str] | None:
    """Exit status, stdout and stderr of ``argv``, or None if it ran past ``timeout``; its
    whole process group is killed on timeout so that a stuck child cannot hold the pipes."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, AttributeError):
            proc.kill()
        proc.communicate()
        return None
    return proc.returncode, out, err


_ASCII_INDEX = re.compile(r"[0-9]+")
_NOT_AVAILABLE = re.compile(r"\[[A-Za-z][A-Za-z /]*\]")  # [N/A], [Not Supported], [Unknown Error]
_MALFORMED = -1


def _parse_query(output: str, reserved: bool = True) -> tuple[GPUInfo, ...] | None:
    """Parse ``index, uuid, name, memory.total, memory.used[, memory.reserved]`` lines; None
    if any is malformed. A name may hold commas: it is everything between the UUID and the
    memory fields."""
    width = 3 if reserved else 2
    gpus: list[GPUInfo] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 + width or not _ASCII_INDEX.fullmatch(fields[0]) or not fields[1]:
            return None
        memory = [_mib(field) for field in fields[len(fields) - width :]]
        if _MALFORMED in memory:
            return None
        total, used, held = (*memory, None) if not reserved else memory
        name = ", ".join(fields[2 : len(fields) - width]) or None
        gpus.append(GPUInfo(len(gpus), fields[0], fields[1], total, name, None, used, held))
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

    Not cached: each call runs nvidia-smi anew. MIG instances are not listed (see above), nor
    is a GPU nvidia-smi cannot reach (its use is then unknown). This is ``memory.used``: the
    memory the driver reserves is apart (``GPUInfo.memory_reserved_mib``).
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    rows = smi_rows(exe, NVIDIA_SMI_IN_USE, timeout)  # a lost GPU: the others are read
    return None if rows.output is None else _parse_in_use(rows.output)


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
