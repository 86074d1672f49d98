"""The GPUs' live state through ``nvidia-smi``, where NVML is not installed.

Two CSV queries per sample: ``--query-gpu`` (memory and utilisation per physical GPU) and
``--query-compute-apps`` (pid and memory per process). Each runs nvidia-smi anew, a process
start per query, so this costs far more than NVML (install ``hwpool[nvml]``).

MIG: both queries name a MIG-enabled GPU only (its processes under the parent's UUID, the
MIG device unsaid). nvidia-smi reports no utilisation for a GPU in MIG mode, so where a GPU's
utilisation is unknown, ``nvidia-smi -L`` is asked for its MIG devices; where it has some,
the default table's "MIG devices" section gives each one's GPU instance (GI), compute
instance (CI) and memory (its GPU instance's, used and total), and its "Processes" section
the GI and CI of each process. The GPU's reading is then replaced by one per MIG device, by
its MIG UUID, with the processes of its (GI, CI): so a lease of a MIG device sees its own
processes. Where the table cannot be read, those devices' memory and processes are unknown.

A query that fails (missing, exit status, timeout, output other than the CSV asked for) makes
what it would have read unknown: no devices if the GPU query failed, no process lists if the
process query did; the problem carries nvidia-smi's own words. A GPU nvidia-smi cannot reach
(``Unable to determine the device handle for GPU ...: GPU is lost``) is left out of the
sample and named in its problem; the other GPUs are read. ``memory.reserved`` is asked for
too, and no longer once the driver says it does not know the field.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .._check import check_real
from .._host._smi import (
    NVIDIA_SMI_LIST,
    NVIDIA_SMI_TABLE,
    RESERVED_FIELD,
    parse_mig_list,
    parse_mig_table,
    run_nvidia_smi,
    smi_number,
    smi_rows,
)
from ._sample import GPUProcess, GPUReading, Sample

__all__ = ["GPU_QUERY", "PROCESS_QUERY", "SmiSampler"]

GPU_QUERY = (
    "--query-gpu=uuid,memory.total,memory.used,utilization.gpu,memory.reserved",
    "--format=csv,noheader,nounits",
)
GPU_QUERY_NO_RESERVED = (
    "--query-gpu=uuid,memory.total,memory.used,utilization.gpu",
    "--format=csv,noheader,nounits",
)
PROCESS_QUERY = ("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")


class SmiSampler:
    """Samples by running ``nvidia-smi`` (found on PATH at each sample), ``timeout`` s each."""

    source = "nvidia-smi"

    def __init__(self, timeout: float = 5.0) -> None:
        seconds = check_real("timeout", timeout)
        if not 0.0 < seconds < float("inf"):
            raise ValueError(f"timeout must be > 0 and finite, got {timeout!r}")
        self.timeout = seconds
        self._query = GPU_QUERY

    def sample(self) -> Sample:
        """Read every physical GPU and its compute processes; see the module docstring."""
        rows = smi_rows(None, self._query, self.timeout)
        if rows.output is None and f'"{RESERVED_FIELD}"' in rows.failure:
            self._query = GPU_QUERY_NO_RESERVED  # a driver without the field: ask without it
            rows = smi_rows(None, self._query, self.timeout)
        output, failure = rows.output, rows.failure
        gpus = None if output is None else _parse_gpus(output, self._query is GPU_QUERY)
        if gpus is None:
            return Sample(self.source, (), failure or "nvidia-smi printed an unexpected CSV")
        lost = "; ".join(f"{device}: {why}" for device, why in rows.failed)
        apps = smi_rows(None, PROCESS_QUERY, self.timeout)  # past a lost GPU too
        output, failure = apps.output, apps.failure
        processes = None if output is None else _parse_processes(output)
        if processes is None:
            failure = failure or "nvidia-smi printed an unexpected process CSV"
            problem = "; ".join(p for p in (lost, f"processes unknown: {failure}") if p)
            return Sample(self.source, gpus, problem)
        readings = tuple(_with(gpu, processes) for gpu in gpus)
        if any(gpu.utilization is None for gpu in gpus):  # as nvidia-smi has it in MIG mode
            sample = self._with_mig(readings)
            return replace(sample, problem="; ".join(p for p in (lost, sample.problem) if p))
        return Sample(self.source, readings, lost)

    def _with_mig(self, readings: tuple[GPUReading, ...]) -> Sample:
        """``readings`` with each MIG-enabled GPU replaced by its MIG devices (see the
        module docstring); what could not be read is named in the sample's problem."""
        listing, failure = run_nvidia_smi(NVIDIA_SMI_LIST, self.timeout)
        migs = parse_mig_list(listing or "")
        if listing is None:
            return Sample(self.source, readings, f"MIG devices unknown: nvidia-smi -L: {failure}")
        if not migs:
            return Sample(self.source, readings)
        table, failure = run_nvidia_smi(NVIDIA_SMI_TABLE, self.timeout)
        sizes = parse_mig_table(table or "")
        problem = "" if sizes else f"MIG devices' memory unknown: {failure or 'no MIG table'}"
        processes = _mig_processes(table or "") if sizes else {}
        devices: list[GPUReading] = []
        for reading in readings:
            for mig in migs.get(reading.uuid, ()):
                row = sizes.get((mig.index, int(mig.device_id)))
                uuid = mig.uuid or ""
                if row is None:
                    devices.append(GPUReading(uuid, None, None, None, None))
                    continue
                gi, ci, used, total = row
                mine = tuple(
                    GPUProcess(pid, uuid, mib)
                    for pid, mib in sorted(processes.get((mig.index, gi, ci), []))
                )
                devices.append(GPUReading(uuid, total, used, None, mine))
            if reading.uuid not in migs:
                devices.append(reading)
        return Sample(self.source, tuple(devices), problem)

    def close(self) -> None:
        """Nothing to release: each sample runs nvidia-smi anew."""


def _rows(output: str, width: int) -> list[list[str]] | None:
    """The CSV's non-blank rows of ``width`` fields each; None if any row has another width."""
    rows = [[f.strip() for f in line.split(",")] for line in output.splitlines() if line.strip()]
    return None if any(len(row) != width or not row[0] for row in rows) else rows


def _parse_gpus(output: str, reserved: bool) -> tuple[GPUReading, ...] | None:
    """``uuid, total, used, utilisation[, reserved]`` rows as readings without processes;
    None if malformed."""
    rows = _rows(output, 5 if reserved else 4)
    if rows is None:
        return None
    try:
        return tuple(
            GPUReading(
                row[0], smi_number(row[1]), smi_number(row[2]), smi_number(row[3]), None,
                smi_number(row[4]) if reserved else None,
            )
            for row in rows
        )  # fmt: skip
    except ValueError:
        return None


def _parse_processes(output: str) -> list[GPUProcess] | None:
    """``gpu_uuid, pid, used_memory`` rows; None if malformed (a pid must be a number)."""
    rows = _rows(output, 3)
    if rows is None:
        return None
    processes = []
    for uuid, pid_field, mib in rows:
        try:
            pid, used = smi_number(pid_field), smi_number(mib)
        except ValueError:
            return None
        if pid is None:
            return None
        processes.append(GPUProcess(pid, uuid, used))
    return processes


_MIG_PROCESS = re.compile(
    r"\|\s*([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+([0-9]+)\s+\S+\s+.*?\s(?:([0-9]+)MiB|N/A)\s*\|"
)


def _mig_processes(table: str) -> dict[tuple[int, int, int], list[tuple[int, int | None]]]:
    """The "Processes" section of nvidia-smi's default table: per (GPU number, GI, CI) the
    (pid, MiB) of each process on a MIG device (rows of whole GPUs, GI and CI ``N/A``, are
    skipped)."""
    found: dict[tuple[int, int, int], list[tuple[int, int | None]]] = {}
    inside = False
    for line in table.splitlines():
        if "Processes:" in line:
            inside = True
        elif inside and (row := _MIG_PROCESS.fullmatch(line.strip())):
            gpu, gi, ci, pid = (int(x) for x in row.groups()[:4])
            mib = None if row.group(5) is None else int(row.group(5))
            found.setdefault((gpu, gi, ci), []).append((pid, mib))
    return found


def _with(gpu: GPUReading, processes: list[GPUProcess]) -> GPUReading:
    """``gpu`` with the processes listed on it."""
    mine = tuple(sorted((p for p in processes if p.gpu == gpu.uuid), key=lambda p: p.pid))
    return replace(gpu, processes=mine)
