"""Pools sized in memory: what each GPU holds in MiB, and requests in MiB turned into demands.

A memory-sized pool gives each GPU a capacity of its memory total, one unit per MiB
(``GPUPool(memory=True)``: the detected totals; ``GPUPool(gpu_memory=["80GiB", "24GiB"])``:
logical GPUs of those sizes). A request then gives ``memory=`` (an amount, see
``hwpool._core._memory``) or a ``fraction`` of a GPU: that share of the total of the GPU it
is granted on, rounded up to whole MiB. On GPUs of one size that is one amount; on GPUs of
different sizes it is a *relative* demand of the core (``Demand(..., relative=True)``), whose
best fit weighs what it needs on each GPU: ``0.5`` takes 40 GiB where it lands on an 80 GiB
GPU and 12 GiB on a 24 GiB one, and ``release(gpu, 0.5)`` gives back that share of ``gpu``.
A fraction of 1 (or none) is one whole GPU, of any size.

Whole GPUs: ``acquire_full(n)`` takes ``n`` completely free GPUs, whatever their size (the
core prefers the smallest). On a pool with MIG instances, ``n`` must be 1: a CUDA process can
use one MIG instance only.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._check import check_bool, check_int
from .._core._capacity import UNITS_PER_GPU, fraction_to_units
from .._core._memory import format_mib, parse_memory
from .._core._scheduler import Demand
from .._host._detect import GPUInfo, detect_gpus
from .._host._visible import no_gpu_message

__all__ = [
    "Demands", "check_whole", "memory_demand", "sized_gpus", "sized_units", "whole_demand",
]  # fmt: skip

_MEMO_SIZE = 4096
"""Entries each memo of :class:`Demands` keeps at most (a program asks for a few sizes)."""


class Demands:
    """The one place where a pool's requests become the core's demands, validated once.

    ``totals``: each GPU's MiB on a pool sized in memory, None on a fraction pool.
    :meth:`one` turns ``fraction`` or ``memory`` into a one-GPU :class:`Demand`,
    :meth:`whole` a count of whole GPUs, and :meth:`units` what a release of ``fraction``
    or ``memory`` on a GPU gives back, all with the rules of :func:`memory_demand`. A float
    fraction and a memory amount are checked once per pool and memoised (floats never change,
    so equal floats are one request); other types (``Fraction``, NumPy numbers) are checked
    on every call. ``fractions`` is the memo of float fractions, which the pool's hot paths
    read directly.
    """

    __slots__ = ("_amounts", "_gpus", "_mib_on", "_totals", "fractions")

    def __init__(self, gpus: tuple[GPUInfo, ...], totals: tuple[int, ...] | None) -> None:
        self._gpus = gpus
        self._totals = totals
        self.fractions: dict[float, Demand] = {}  # float fraction -> its one-GPU demand
        self._amounts: dict[int | str, Demand] = {}  # memory amount -> its demand
        self._mib_on: dict[tuple[int, float], int] = {}  # (gpu, fraction) -> MiB there

    def one(self, fraction: object, memory: object) -> Demand:
        """The one-GPU demand for ``fraction`` (default 1) or ``memory``; TypeError or
        ValueError naming the argument for a bad one (see :func:`memory_demand`)."""
        if fraction is None and memory is None:
            fraction = 1.0  # the default: one whole GPU, memoised as 1.0
        if memory is None and fraction.__class__ is float:
            demand = self.fractions.get(fraction)
            if demand is None:
                demand = memory_demand(self._totals, fraction, None)
                if len(self.fractions) < _MEMO_SIZE:
                    self.fractions[fraction] = demand
            return demand
        if fraction is None and memory.__class__ in _AMOUNT_TYPES and self._totals is not None:
            demand = self._amounts.get(memory)
            if demand is None:
                demand = memory_demand(self._totals, None, memory)
                if len(self._amounts) < _MEMO_SIZE:
                    self._amounts[memory] = demand
            return demand
        return memory_demand(self._totals, fraction, memory)

    def whole(self, count: object) -> Demand:
        """``count`` completely free GPUs (validated by :func:`check_whole`)."""
        number = check_whole(self._gpus, count)
        if self._totals is not None:
            return whole_demand(self._totals, number)
        return Demand(number, UNITS_PER_GPU)

    def units(self, gpu: int, fraction: object, memory: object) -> int:
        """The units a release of ``fraction`` or ``memory`` on ``gpu`` gives back: a
        fraction pool's share units, or MiB on a pool sized in memory, where a fraction is
        that share of ``gpu``'s total."""
        totals = self._totals
        if totals is None:
            return self.one(fraction, memory).units
        if fraction is None and memory.__class__ in _AMOUNT_TYPES:
            return self.one(None, memory).units
        if fraction is not None and memory is not None:
            memory_demand(totals, fraction, memory)  # raises: both given
        if memory is None and fraction.__class__ is float:
            mib = self._mib_on.get((gpu, fraction))
            if mib is None:
                mib = sized_units(totals, fraction, None, gpu)
                if len(self._mib_on) < _MEMO_SIZE:
                    self._mib_on[gpu, fraction] = mib
            return mib
        return sized_units(totals, fraction, memory, gpu)


_AMOUNT_TYPES = (int, str)  # memory amounts memoised (exactly these types: not bool)


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


def memory_demand(totals: tuple[int, ...] | None, fraction: object, memory: object) -> Demand:
    """The one-GPU demand for ``fraction`` or ``memory`` (at most one given) on a pool.

    ``totals`` is None for a fraction pool. On a memory-sized pool, a fraction of 1 (or
    nothing given) is one whole GPU, of any size, and a fraction below 1 on GPUs of different
    sizes is a relative demand (that share of whichever GPU it is granted). TypeError for both
    given or a wrong type, ValueError for memory on a fraction pool, an amount larger than
    every GPU, or a fraction outside (0, 1].
    """
    if fraction is not None and memory is not None:
        raise TypeError(f"give fraction or memory, not both (fraction={fraction!r}, "
                        f"memory={memory!r})")  # fmt: skip
    if totals is None:
        if memory is not None:
            raise ValueError(
                f"memory={memory!r}: this pool shares fractions of a GPU; a pool sized in "
                "memory is GPUPool(memory=True) or GPUPool(gpu_memory=[...])"
            )
        return Demand(1, fraction_to_units(1.0 if fraction is None else fraction))
    if memory is None:
        units = fraction_to_units(1.0 if fraction is None else fraction)
        if units == UNITS_PER_GPU:
            return whole_demand(totals, 1)
        if len(set(totals)) > 1:  # a share of whichever GPU it lands on
            return Demand(1, units, relative=True)
    return Demand(1, sized_units(totals, fraction, memory, None))


def sized_units(totals: tuple[int, ...], fraction: object, memory: object, gpu: int | None) -> int:
    """MiB for ``memory``, or for ``fraction`` of GPU ``gpu``'s total, rounded up as the core
    rounds a relative demand (``gpu`` None: of the one size all GPUs have; ValueError where
    they differ, since the amount then depends on the GPU)."""
    if memory is not None:
        mib = parse_memory(memory, "memory")
        largest = max(totals)
        if mib > largest:
            raise ValueError(
                f"memory={memory!r} ({mib} MiB) is more than the largest GPU of this pool "
                f"({_in_mib(largest)}): it could never be granted"
            )
        return mib
    units = fraction_to_units(1.0 if fraction is None else fraction)
    if gpu is not None:
        total = totals[gpu]
    elif len(set(totals)) == 1:
        total = totals[0]
    else:
        sizes = ", ".join(format_mib(t) for t in sorted(set(totals), reverse=True))
        raise ValueError(
            f"fraction={fraction!r} on GPUs of different sizes ({sizes}) would mean a different "
            "amount on each; ask for memory=... instead"
        )
    return max(1, -(-units * total // UNITS_PER_GPU))


def _in_mib(mib: int) -> str:
    """``80GiB, 81920 MiB`` where a larger unit writes ``mib`` exactly, else ``81559 MiB``
    alone (not the same number twice)."""
    short = format_mib(mib)
    return f"{mib} MiB" if short.endswith("MiB") else f"{short}, {mib} MiB"


def whole_demand(totals: tuple[int, ...], count: int) -> Demand:
    """``count`` (validated) completely free GPUs of a memory-sized pool, whatever their size."""
    if len(set(totals)) == 1:
        return Demand(count, totals[0])
    return Demand(count, max(totals), whole=True)


def check_whole(gpus: tuple[GPUInfo, ...], count: object) -> int:
    """``count`` whole GPUs, validated: 1..num_gpus, and 1 where the pool has MIG instances."""
    number = check_int("count", count, minimum=1, maximum=len(gpus), maximum_name="num_gpus")
    if number > 1 and any(gpu.is_mig for gpu in gpus):
        raise ValueError(
            f"count={number}: this pool's GPUs include MIG instances, and a CUDA process can "
            "use only one MIG instance; ask for one GPU at a time"
        )
    return number
