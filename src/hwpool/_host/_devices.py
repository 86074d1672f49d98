"""What is known of one GPU, and how ``CUDA_VISIBLE_DEVICES`` entries pick devices out.

Kept apart from the sources (nvidia-smi, NVML) so that each reports the same record.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = ["GPUInfo", "device_id", "match_visible", "parse_visible_devices"]


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
    """

    index: int
    device_id: str
    uuid: str | None = None
    memory_mib: int | None = None
    name: str | None = None
    parent: str | None = None
    memory_used_mib: int | None = None
    memory_reserved_mib: int | None = None

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


_DEVICE = re.compile(r"[0-9]+|(GPU|MIG)-[0-9A-Za-z/-]+")


def device_id(info: GPUInfo) -> str:
    """The id that selects ``info``'s device in ``CUDA_VISIBLE_DEVICES`` (UUID first)."""
    return info.uuid or info.device_id


def parse_visible_devices(raw: str) -> list[str]:
    """Split CUDA_VISIBLE_DEVICES; like CUDA, stop at the first entry that is not an index,
    a ``GPU-`` UUID or a ``MIG-`` id (``-1``, an empty entry, ``foo``)."""
    ids: list[str] = []
    for part in raw.split(","):
        device = part.strip()
        if not _DEVICE.fullmatch(device):
            break
        ids.append(device)
    return ids


def match_visible(ids: Sequence[str], found: Sequence[GPUInfo]) -> tuple[GPUInfo, ...]:
    """One GPUInfo per entry of ``ids``, with what detection ``found`` about that device.

    An index matches the whole GPU of that physical index; a ``GPU-``/``MIG-`` id matches the
    device whose UUID it is, or starts (CUDA accepts a unique prefix). An entry that matches
    nothing, or more than one device, keeps only its ``device_id``.
    """
    gpus = []
    for i, entry in enumerate(ids):
        hits = [g for g in found if _names(entry, g)]
        if len(hits) == 1:
            gpus.append(replace(hits[0], index=i, device_id=entry))
        else:
            gpus.append(GPUInfo(i, entry))
    return tuple(gpus)


def _names(entry: str, gpu: GPUInfo) -> bool:
    if entry.isascii() and entry.isdigit():
        return not gpu.is_mig and gpu.device_id == str(int(entry))
    return gpu.uuid is not None and gpu.uuid.startswith(entry)
