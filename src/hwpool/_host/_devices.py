"""What is known of one GPU, and how ``CUDA_VISIBLE_DEVICES`` entries pick devices out.

Kept apart from the sources (nvidia-smi, NVML) so that each reports the same record.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

__all__ = ["GPUInfo", "device_id", "match_visible", "memory_group", "memory_groups_of",
           "parse_visible_devices"]  # fmt: skip


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
    memory_group: str | None = None

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
