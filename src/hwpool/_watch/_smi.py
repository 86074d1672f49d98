"""The GPUs' live state through ``nvidia-smi``, where NVML is not installed.

Two CSV queries per sample: ``--query-gpu`` (memory and utilisation per physical GPU) and
``--query-compute-apps`` (pid and memory per process). Each runs nvidia-smi anew, a process
start per query, so this costs far more than NVML (install ``hwpool[nvml]``). MIG instances
are not listed: nvidia-smi reports processes by their physical GPU.

A query that fails (missing, exit status, timeout, output other than the CSV asked for) makes
what it would have read unknown: no devices if the GPU query failed, no process lists if the
process query did.
"""

from __future__ import annotations

from .._check import check_real
from .._host._smi import run_nvidia_smi, smi_number
from ._sample import GPUProcess, GPUReading, Sample

__all__ = ["GPU_QUERY", "PROCESS_QUERY", "SmiSampler"]

GPU_QUERY = (
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

    def sample(self) -> Sample:
        """Read every physical GPU and its compute processes; see the module docstring."""
        output, failure = run_nvidia_smi(GPU_QUERY, self.timeout)
        gpus = None if output is None else _parse_gpus(output)
        if gpus is None:
            return Sample(self.source, (), failure or "nvidia-smi printed an unexpected CSV")
        output, failure = run_nvidia_smi(PROCESS_QUERY, self.timeout)
        processes = None if output is None else _parse_processes(output)
        if processes is None:
            failure = failure or "nvidia-smi printed an unexpected process CSV"
            return Sample(self.source, gpus, f"processes unknown: {failure}")
        return Sample(self.source, tuple(_with(gpu, processes) for gpu in gpus))

    def close(self) -> None:
        """Nothing to release: each sample runs nvidia-smi anew."""


def _rows(output: str, width: int) -> list[list[str]] | None:
    """The CSV's non-blank rows of ``width`` fields each; None if any row has another width."""
    rows = [[f.strip() for f in line.split(",")] for line in output.splitlines() if line.strip()]
    return None if any(len(row) != width or not row[0] for row in rows) else rows


def _parse_gpus(output: str) -> tuple[GPUReading, ...] | None:
    """``uuid, total, used, utilisation`` rows as readings without processes; None if malformed."""
    rows = _rows(output, 4)
    if rows is None:
        return None
    try:
        return tuple(
            GPUReading(uuid, smi_number(total), smi_number(used), smi_number(busy), None)
            for uuid, total, used, busy in rows
        )
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
    return GPUReading(gpu.uuid, gpu.total_mib, gpu.used_mib, gpu.utilization, mine)
