"""Pools sized in memory: the GPUs and what each holds in MiB.

A memory-sized pool gives each GPU a capacity of its memory total, one unit per MiB
(``GPUPool(memory=True)``: the detected totals; ``GPUPool(gpu_memory=["80GiB", "24GiB"])``:
logical GPUs of those sizes). A request then gives ``memory=`` (an amount, see
``hwpool._core._memory``) or a ``fraction`` of a GPU: that share of the total of the GPU it
is granted on, rounded up to whole MiB. On GPUs of one size that is one amount; on GPUs of
different sizes it is a *relative* demand of the core (``Demand(..., relative=True)``), whose
best fit weighs what it needs on each GPU: ``0.5`` takes 40 GiB where it lands on an 80 GiB
GPU and 12 GiB on a 24 GiB one, and ``release(gpu, 0.5)`` gives back that share of ``gpu``.
A fraction of 1 (or none) is one whole GPU, of any size. Requests become the core's demands
in ``hwpool._core._demand``, the one path of every front.

Whole GPUs: ``acquire_full(n)`` takes ``n`` completely free GPUs, whatever their size (the
core prefers the smallest). On a pool with MIG instances, ``n`` must be 1: a CUDA process can
use one MIG instance only.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._check import check_bool
from .._core._memory import parse_memory
from .._host._detect import GPUInfo, detect_gpus
from .._host._visible import no_gpu_message

__all__ = ["capacities_of", "sized_gpus", "totals_of"]


def sized_gpus(
    num_gpus: object, memory: object, gpu_memory: object, reserve_in_use: object = False
) -> tuple[GPUInfo, ...] | None:
    """The GPUs of a memory-sized pool (each with ``memory_mib``), or None for a fraction pool.

    With ``reserve_in_use`` (only with ``memory=True``), each GPU also has a known
    ``memory_used_mib``, below its total (see :func:`capacities_of`). TypeError for a wrong type or
    a conflicting combination; ValueError for a bad amount or, with ``memory=True``, for a GPU
    whose memory detection did not find (or, reserving, whose use it did not find, or that has
    none left).
    """
    reserve = check_bool("reserve_in_use", reserve_in_use)
    if check_bool("memory", memory) and gpu_memory is not None:
        raise TypeError("give memory=True or gpu_memory=[...], not both")
    _check_reserve(reserve, memory, gpu_memory)
    if (memory or gpu_memory is not None) and num_gpus is not None:
        what = "memory=True" if memory else "gpu_memory"
        raise TypeError(f"give num_gpus or {what}, not both (num_gpus={num_gpus!r})")
    if gpu_memory is not None:
        return _logical(gpu_memory)
    if memory:
        return _detected(reserve)
    return None


def _check_reserve(reserve: bool, memory: object, gpu_memory: object) -> None:
    """TypeError for ``reserve_in_use=True`` where there is no detected memory to read."""
    if reserve and gpu_memory is not None:
        raise TypeError(
            "reserve_in_use=True reads the memory in use on detected GPUs; logical GPUs "
            f"(gpu_memory={gpu_memory!r}) have none: give them smaller sizes instead"
        )
    if reserve and not memory:
        raise TypeError(
            "reserve_in_use=True needs memory=True: it takes the memory in use off each "
            "detected GPU's total, and only a pool sized in memory counts memory"
        )


def _logical(gpu_memory: object) -> tuple[GPUInfo, ...]:
    if isinstance(gpu_memory, str | bytes) or not isinstance(gpu_memory, Sequence):
        raise TypeError(
            f"gpu_memory must be a list of amounts such as ['80GiB', '24GiB'], got {gpu_memory!r}"
        )
    if not gpu_memory:
        raise ValueError("gpu_memory must name at least one GPU, got []")
    sizes = [parse_memory(amount, f"gpu_memory[{i}]") for i, amount in enumerate(gpu_memory)]
    return tuple(GPUInfo(i, str(i), memory_mib=mib) for i, mib in enumerate(sizes))


def _detected(reserve: bool) -> tuple[GPUInfo, ...]:
    found = detect_gpus(describe=True)
    if not found.gpus:
        raise ValueError(no_gpu_message(found.detail, "memory=True"))
    unknown = [gpu.index for gpu in found.gpus if gpu.memory_mib is None]
    if unknown:
        raise ValueError(
            f"memory=True needs every GPU's memory, but detection ({found.detail}) found "
            f"none for GPU(s) {unknown}; give the sizes with gpu_memory=[...], or "
            "install the nvml extra (pip install 'hwpool[nvml]')"
        )
    if reserve:
        _check_in_use(found.gpus, found.detail)
    return found.gpus


def _check_in_use(gpus: tuple[GPUInfo, ...], detail: str) -> None:
    """ValueError for a GPU whose memory in use is unknown, or that has none left.

    An unknown use is not taken as 0: the caller asked to leave it alone, and a guess of
    nothing would hand out memory that is taken. A GPU with nothing left is refused rather
    than kept at 1 MiB, where it would still count as a completely free whole GPU.
    """
    unknown = [gpu for gpu in gpus if gpu.memory_used_mib is None]
    if unknown:
        why = (
            " (nvidia-smi gives none for a MIG device without its table)"
            if unknown[0].is_mig
            else ""
        )
        raise ValueError(
            f"reserve_in_use=True needs every GPU's memory in use, but detection ({detail}) "
            f"could not read it for GPU(s) {[gpu.index for gpu in unknown]}{why}; install the "
            "nvml extra (pip install 'hwpool[nvml]'), or leave reserve_in_use off and give "
            "smaller sizes with gpu_memory=[...]"
        )
    for gpu in gpus:
        if _withheld(gpu) >= (gpu.memory_mib or 0):
            held = f" and {gpu.memory_reserved_mib} MiB reserved" if gpu.memory_reserved_mib else ""
            raise ValueError(
                f"reserve_in_use=True: GPU {gpu.index} (device {gpu.device_id}) has "
                f"{gpu.memory_used_mib} MiB in use{held} of its {gpu.memory_mib} MiB, so nothing "
                "is left to share; hide it with CUDA_VISIBLE_DEVICES, or leave reserve_in_use off"
            )


def _withheld(gpu: GPUInfo) -> int:
    """What ``reserve_in_use`` takes off a GPU: the memory in use and the memory the driver
    reserves (nvidia-smi's ``memory.reserved``), neither of which a lease can have."""
    return (gpu.memory_used_mib or 0) + (gpu.memory_reserved_mib or 0)


def totals_of(gpus: tuple[GPUInfo, ...]) -> tuple[int, ...]:
    """Each GPU's capacity in a memory-sized pool: its memory in MiB (for MIG devices of one
    ``memory_group``, the least any of them reports: they draw on that one memory)."""
    return _by_group(gpus, tuple(gpu.memory_mib or 0 for gpu in gpus))


def _by_group(gpus: Sequence[GPUInfo], values: tuple[int, ...]) -> tuple[int, ...]:
    """``values``, each GPU's replaced by the least of its ``memory_group``'s."""
    least: dict[str, int] = {}
    for gpu, value in zip(gpus, values, strict=True):
        if gpu.memory_group is not None:
            least[gpu.memory_group] = min(value, least.get(gpu.memory_group, value))
    return tuple(
        value if gpu.memory_group is None else least[gpu.memory_group]
        for gpu, value in zip(gpus, values, strict=True)
    )


def capacities_of(gpus: tuple[GPUInfo, ...], reserve_in_use: bool) -> tuple[int, ...]:
    """Each GPU's capacity in a memory-sized pool: its memory in MiB, less, with
    ``reserve_in_use``, the memory in use and reserved by the driver when it was detected
    (what the driver does not count as free; :func:`sized_gpus` has checked the use is known
    and smaller). Read once: what the pool's own leases use later is not taken off again, and
    neither is what other processes take after the start."""
    if not reserve_in_use:
        return totals_of(gpus)
    left = tuple((gpu.memory_mib or 0) - _withheld(gpu) for gpu in gpus)
    return _by_group(gpus, left)
