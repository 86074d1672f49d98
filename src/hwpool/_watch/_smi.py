"""The GPUs' live state through ``nvidia-smi``, where NVML is not installed.

Two CSV queries per sample: ``--query-gpu`` (memory and utilisation per physical GPU) and
``--query-compute-apps`` (pid and memory per process). Each runs nvidia-smi anew, a process
start per query, so this costs far more than NVML (install ``hwpool[nvml]``). MIG instances
are not listed: nvidia-smi reports processes by their physical GPU.

A query that fails (missing, exit status, timeout, output other than the CSV asked for) makes
what it would have read unknown: no devices if the GPU query failed, no process lists if the
process query did; the problem carries nvidia-smi's own words. A GPU nvidia-smi cannot reach
(``Unable to determine the device handle for GPU ...: GPU is lost``) is left out of the
sample and named in its problem; the other GPUs are read. ``memory.reserved`` is asked for
too, and no longer once the driver says it does not know the field.
"""

from __future__ import annotations

from dataclasses import replace

from .._check import check_real
from .._host._smi import RESERVED_FIELD, smi_number, smi_rows
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
        return Sample(self.source, tuple(_with(gpu, processes) for gpu in gpus), lost)

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


def _with(gpu: GPUReading, processes: list[GPUProcess]) -> GPUReading:
    """``gpu`` with the processes listed on it."""
    mine = tuple(sorted((p for p in processes if p.gpu == gpu.uuid), key=lambda p: p.pid))
    return replace(gpu, processes=mine)
