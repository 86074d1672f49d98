"""GPUs that draw on one memory: the free units of each, kept as the scheduler reads them.

MIG compute instances of one GPU instance are separate CUDA devices, but they share the GPU
instance's memory (NVIDIA's MIG User Guide, "Concepts" and "MIG Device Names"): each device
reports that whole memory as its total, and what one holds, the others cannot have. Such
GPUs form a *memory group*; a GPU in no group has a memory of its own.

:class:`SharedFree` is the scheduler's list of free units per GPU for a scheduler with
memory groups. Each GPU's free units are ``min(its total - what is held on it, the group's
capacity - what is held on all of the group)``, so every check the scheduler makes on
``free[gpu]`` (fits, best fit, "completely free" for a whole GPU) holds for the group too.
A write ``free[gpu] = value`` is read as "``free[gpu]`` went down by ``old - value``" (a
grant, a withholding) or up (a release): it moves that many units into or out of what is
held on ``gpu`` and recomputes its group. So a whole-GPU grant on one member (its free set
to 0 from its total) holds the whole group's memory, as CUDA lets that process allocate
all of it. Pure: no I/O, clock or threads, like the rest of the core.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["SharedFree", "check_memory_groups"]


def members_of(
    name: str, labels: object, num_gpus: int, what: str, *, none_alone: bool
) -> dict[Hashable, list[int]]:
    """The GPUs under each label of ``labels`` (one label per GPU; with ``none_alone``,
    None labels no group), labels in the order of their lowest GPU. TypeError or ValueError
    naming ``name`` unless it is a sequence of ``num_gpus`` hashables; ``what`` says what a
    label is."""
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
        raise TypeError(
            f"{name} must be a sequence with each GPU's {what}, "
            f"got {labels!r} ({type(labels).__name__})"
        )
    if len(labels) != num_gpus:
        raise ValueError(
            f"{name} must name one group per GPU ({num_gpus}), got {len(labels)}: {labels!r}"
        )
    members: dict[Hashable, list[int]] = {}
    for gpu, label in enumerate(labels):
        if label is None and none_alone:
            continue
        try:
            members.setdefault(label, []).append(gpu)
        except TypeError:
            raise TypeError(
                f"{name}[{gpu}] must be hashable, got {label!r} ({type(label).__name__})"
            ) from None
    return members


def check_memory_groups(
    memory_groups: object, totals: Sequence[int]
) -> tuple[tuple[int, ...], ...] | None:
    """The GPUs of each memory group of two or more GPUs, in the order of their lowest GPU;
    None where no two GPUs share a memory. ``memory_groups`` gives each GPU's group (any
    hashable; None: a memory of its own). TypeError or ValueError naming ``memory_groups``
    unless it is a sequence of one entry per GPU, hashable, whose GPUs in one group have
    equal totals (each device of a GPU instance reports the whole of its memory)."""
    if memory_groups is None:
        return None
    members = members_of(
        "memory_groups", memory_groups, len(totals), "memory group (None: its own)", none_alone=True
    )
    shared = tuple(tuple(gpus) for gpus in members.values() if len(gpus) > 1)
    for gpus in shared:
        sizes = {totals[gpu] for gpu in gpus}
        if len(sizes) > 1:
            raise ValueError(
                f"memory_groups: GPUs {list(gpus)} share one memory but have different totals "
                f"{[totals[gpu] for gpu in gpus]}; give each the group's capacity"
            )
    return shared or None


class SharedFree(list[int]):
    """Free units per GPU (a list, as the scheduler indexes it) where ``groups`` share one
    memory each; see the module docstring. ``held[gpu]``: the units held on ``gpu`` itself
    (grants and withholdings), what a release on it may give back."""

    __slots__ = ("_capacity", "_group_of", "_groups", "_totals", "_used", "held")

    def __init__(self, totals: Sequence[int], groups: tuple[tuple[int, ...], ...]) -> None:
        super().__init__(totals)
        self._totals = tuple(totals)
        self._groups = groups
        self._group_of = [-1] * len(totals)
        for k, gpus in enumerate(groups):
            for gpu in gpus:
                self._group_of[gpu] = k
        self._capacity = [totals[gpus[0]] for gpus in groups]
        self._used = [0] * len(groups)
        self.held = [0] * len(totals)

    def __setitem__(self, gpu: int, value: int) -> None:  # type: ignore[override]
        taken = list.__getitem__(self, gpu) - value
        self.held[gpu] += taken
        k = self._group_of[gpu]
        if k < 0:
            list.__setitem__(self, gpu, value)
            return
        self._used[k] += taken
        room = self._capacity[k] - self._used[k]
        totals, held = self._totals, self.held
        for member in self._groups[k]:
            list.__setitem__(self, member, min(totals[member] - held[member], room))

    def group_held(self) -> tuple[tuple[tuple[int, ...], int, int], ...]:
        """Per memory group: its GPUs, its capacity and the units held on all of them."""
        return tuple(zip(self._groups, self._capacity, self._used, strict=True))
