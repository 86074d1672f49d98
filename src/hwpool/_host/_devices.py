"""What is known of one GPU, and the id that selects it in ``CUDA_VISIBLE_DEVICES``.

Kept apart from the sources (nvidia-smi, NVML) so that each reports the same record; how
``CUDA_VISIBLE_DEVICES`` entries pick devices out is ``_visible``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["GPUInfo", "device_id", "memory_group", "memory_groups_of"]


@dataclass(frozen=True, slots=True)
class GPUInfo:
    """One GPU: its logical index in the pool and what is known of the device behind it.

    ``device_id`` is what to put in ``CUDA_VISIBLE_DEVICES`` to select this device (a physical
    index, a UUID or a MIG id); ``uuid``, ``memory_mib`` (the total, in MiB) and ``name`` come
    from NVML or nvidia-smi when one ran. A MIG instance is a GPU of its own size whose
    ``parent`` is the UUID of the physical GPU it is carved from (None for a whole GPU).
    ``memory_used_mib`` is the memory in use on the device when it was detected (by any
    process, in MiB rounded up); None where the source could not say (nvidia-smi knows none
    for a MIG instance). It is a reading, not a reservation: see
    :func:`hwpool.gpu_memory_in_use` for a new one. ``memory_reserved_mib`` is what the driver
    and firmware keep for themselves (nvidia-smi's ``memory.reserved``, NVML's
    ``nvmlMemory_v2_t.reserved``), which no process can allocate; None where the source does
    not report it (drivers before it was added, where ``used`` already counts it).

    ``memory_group`` names the memory a MIG device draws on: ``"<parent UUID>/gi<N>"`` for
    the GPU instance ``N`` it is a compute instance of. Compute instances of one GPU instance
    share its memory (each is a CUDA device of its own, with that whole memory as its total),
    so devices with one ``memory_group`` draw on one capacity; None for a whole GPU, or where
    the GPU instance is unknown.
    """

    index: int
    device_id: str
    uuid: str | None = None
    memory_mib: int | None = None
    name: str | None = None
    parent: str | None = None
    memory_used_mib: int | None = None
    memory_reserved_mib: int | None = None
    memory_group: str | None = None

    @property
    def memory_free_mib(self) -> int | None:
        """What the driver counts as free: total less used less reserved (reserved taken as
        counted in used where unknown); None where the total or the use is unknown."""
        if self.memory_mib is None or self.memory_used_mib is None:
            return None
        return max(0, self.memory_mib - self.memory_used_mib - (self.memory_reserved_mib or 0))

    @property
    def is_mig(self) -> bool:
        """Whether this is a MIG instance (a CUDA process can use only one of those)."""
        return self.parent is not None


def memory_group(parent: str, gpu_instance: int) -> str:
    """The ``memory_group`` of the compute instances of GPU instance ``gpu_instance`` on the
    GPU whose UUID is ``parent``."""
    return f"{parent}/gi{gpu_instance}"


def memory_groups_of(gpus: Sequence[GPUInfo]) -> tuple[str | None, ...] | None:
    """Each GPU's ``memory_group`` for the core (rule 13), or None where no two GPUs share a
    memory (the core then has nothing to keep)."""
    groups = tuple(gpu.memory_group for gpu in gpus)
    named = [group for group in groups if group is not None]
    return groups if len(set(named)) < len(named) else None


def device_id(info: GPUInfo) -> str:
    """The id that selects ``info``'s device in ``CUDA_VISIBLE_DEVICES`` (UUID first)."""
    return info.uuid or info.device_id
