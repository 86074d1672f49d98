"""One reading of the GPUs: per device its memory and utilisation, per process its memory.

A value the driver cannot give, or that failed this time, is None ("unknown"), never 0: a
caller that acts on memory (the hysteresis, the over-lease check) must tell "nothing there"
from "could not look". Devices are named by UUID (``GPU-...``, ``MIG-...``), which stays the
same across reboots where an index may not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["GPUProcess", "GPUReading", "Sample", "Sampler", "mib_up"]

_MIB = 2**20


@dataclass(frozen=True)
class GPUProcess:
    """A process with a context on a GPU: its pid (in the host's pid namespace, as the driver
    reports it), the device's UUID and the GPU memory it holds (MiB; None if unknown)."""

    pid: int
    gpu: str
    used_mib: int | None


@dataclass(frozen=True)
class GPUReading:
    """One device: memory total and in use (MiB), utilisation (percent of the driver's last
    sample period in which a kernel ran), its processes (None: the list was unreadable) and
    the memory the driver and firmware reserve (MiB; None where the source does not say:
    there ``used_mib`` already counts it)."""

    uuid: str
    total_mib: int | None
    used_mib: int | None
    utilization: int | None
    processes: tuple[GPUProcess, ...] | None
    reserved_mib: int | None = None

    @property
    def free_mib(self) -> int | None:
        """What the driver counts as free: total less used less reserved; None if unknown."""
        if self.total_mib is None or self.used_mib is None:
            return None
        return max(0, self.total_mib - self.used_mib - (self.reserved_mib or 0))


@dataclass(frozen=True)
class Sample:
    """What one poll read: from ``source`` (``"nvml"`` or ``"nvidia-smi"``), the devices it
    could list (none when the whole poll failed), and ``problem``: what failed, in words
    ("" when everything was read)."""

    source: str
    gpus: tuple[GPUReading, ...]
    problem: str = ""

    @property
    def processes(self) -> tuple[GPUProcess, ...]:
        """Every process listed on every device (a device whose list failed adds none)."""
        return tuple(p for gpu in self.gpus for p in gpu.processes or ())


class Sampler(Protocol):
    """Reads the GPUs once per call; never raises for a driver failure (see :class:`Sample`)."""

    source: str

    def sample(self) -> Sample:
        """Read every device now."""
        ...

    def close(self) -> None:
        """Release what the sampler holds (NVML's initialisation); idempotent."""
        ...


def mib_up(count: object) -> int | None:
    """A byte count in MiB rounded up (never less than is in use); None unless a count."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return None
    return -(-count // _MIB)
