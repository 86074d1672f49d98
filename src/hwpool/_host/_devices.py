"""What is known of one GPU, and the id that selects it in ``CUDA_VISIBLE_DEVICES``.

Kept apart from the sources (nvidia-smi, NVML) so that each reports the same record; how
``CUDA_VISIBLE_DEVICES`` entries pick devices out is ``_visible``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUInfo", "device_id"]


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
    :func:`hwpool.gpu_memory_in_use` for a new one.
    """

    index: int
    device_id: str
    uuid: str | None = None
    memory_mib: int | None = None
    name: str | None = None
    parent: str | None = None
    memory_used_mib: int | None = None

    @property
    def is_mig(self) -> bool:
        """Whether this is a MIG instance (a CUDA process can use only one of those)."""
        return self.parent is not None


def device_id(info: GPUInfo) -> str:
    """The id that selects ``info``'s device in ``CUDA_VISIBLE_DEVICES`` (UUID first)."""
    return info.uuid or info.device_id
