"""The books: what each GPU has, holds and withholds, and the clock (rules 1, 12, 13).

:class:`Books` keeps each GPU's total and free units (a memory group's GPUs draw on one
capacity: :class:`~hwpool._core._shared.SharedFree`), the units withheld from the queue, the
GPU groups and memory groups, the clock (the latest ``now`` any input gave) and the ticket
numbers. It checks what a caller hands back (a release, a withhold, the books it rebuilds
the core from after an interrupted call) and answers what a demand needs on each GPU. It
makes no decision: placement, admission and the policies read and change ``free`` through it.
Rules kept: 1 (what a demand needs on each GPU), 12 and 13 (which GPUs group together).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Sequence

from .._check import check_int, check_real
from ._requests import Demand, Grant, share
from ._shared import SharedFree, check_memory_groups, members_of

__all__ = ["BookedGrant", "Books", "check_groups", "check_rebuilt_ticket", "check_totals"]

BookedGrant = tuple[int, tuple[tuple[int, int], ...]]
"""A grant held before a rebuild: its ticket and ``(gpu, units)`` on each of its GPUs."""


def check_groups(groups: object, num_gpus: int) -> tuple[tuple[int, ...], ...] | None:
    """The GPUs of each group (rule 12), groups in the order of their lowest GPU; None for
    no groups or one group (where no decision changes). TypeError or ValueError naming
    ``groups`` unless it is a sequence of ``num_gpus`` hashables."""
    if groups is None:
        return None
    members = members_of("groups", groups, num_gpus, "group", none_alone=False)
    if len(members) == 1:
        return None
    return tuple(tuple(gpus) for gpus in members.values())


def check_totals(gpus: object, units_per_gpu: object, default: int) -> list[int]:
    """Each GPU's total from a count of GPUs of ``units_per_gpu`` (None: ``default``) or a
    sequence of totals; TypeError or ValueError naming the argument otherwise."""
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, (int, Sequence)):
        raise TypeError(f"gpus must be an int or a sequence of ints, got {gpus!r}")
    if isinstance(gpus, Sequence):
        if units_per_gpu is not None:
            raise TypeError(
                f"give units_per_gpu only with a count of GPUs, not with totals "
                f"(units_per_gpu={units_per_gpu!r})"
            )
        if not gpus:
            raise ValueError(f"gpus must hold at least one GPU's total, got {gpus!r}")
        return [check_int(f"gpus[{i}]", t, minimum=1) for i, t in enumerate(gpus)]
    count = check_int("gpus", gpus, minimum=1)
    size = default if units_per_gpu is None else units_per_gpu
    return [check_int("units_per_gpu", size, minimum=1)] * count


class Books:
    """Totals, free and withheld units per GPU, groups, memory groups, clock and tickets."""

    def __init__(
        self,
        totals: list[int],
        groups: Sequence[Hashable] | None,
        memory_groups: Sequence[Hashable | None] | None,
    ) -> None:
        self.num_gpus = len(totals)
        self.units_per_gpu = max(totals)  # every GPU's total when they are equal
        self.smallest = min(totals)
        self.totals = totals
        self.uniform = len(set(totals)) == 1
        # Rule 12: the GPUs of each group (None: one group, no rule to keep).
        self.groups = check_groups(groups, self.num_gpus)
        # Rule 13: the GPUs of each memory group of two or more (None: every GPU its own).
        self.shared = check_memory_groups(memory_groups, totals)
        self.sibling_of = {
            gpu: tuple(other for other in gpus if other != gpu)
            for gpus in self.shared or ()
            for gpu in gpus
        }
        self.tickets = itertools.count(1)
        self.now = 0.0  # the latest time any input gave
        # Relative demands on GPUs of different sizes: share in units -> need on each GPU.
        self.relative_needs: dict[int, list[int]] = {}
        self.withheld = [0] * self.num_gpus  # units held by no one (Scheduler.withhold)
        self.free: list[int] = []
        self.start_over()

    def start_over(self) -> None:
        """Every GPU free (a new list: whoever keeps a reference to ``free`` takes it anew)."""
        shared = self.shared
        self.free = list(self.totals) if shared is None else SharedFree(self.totals, shared)

    def take_withheld(self) -> None:
        """Take what is withheld out of the free units again (after :meth:`start_over`)."""
        for gpu, units in enumerate(self.withheld):
            self.free[gpu] -= units

    # ------------------------------------------------------------ what a demand needs
    def needs_of(self, demand: Demand) -> list[int]:
        """Units a relative ``demand`` needs on each GPU (rule 1), memoised per share."""
        needs = self.relative_needs.get(demand.units)
        if needs is None:
            needs = [share(demand.units, total) for total in self.totals]
            if len(self.relative_needs) < 4096:
                self.relative_needs[demand.units] = needs
        return needs

    def need(self, demand: Demand, gpu: int) -> int:
        """Units ``demand`` needs free on ``gpu``: all of it for whole GPUs, its share of
        it for a relative demand."""
        if demand.whole or demand.count > 1:
            return self.totals[gpu]
        return self.needs_of(demand)[gpu] if demand.relative else demand.units

    def units_of(self, demand: Demand, gpus: tuple[int, ...]) -> int:
        """``Grant.units`` for ``demand`` on ``gpus``: 0 for whole GPUs of different sizes,
        what a relative demand needs on its one GPU."""
        if demand.relative:
            return self.needs_of(demand)[gpus[0]]
        if not demand.whole:
            return demand.units
        sizes = {self.totals[gpu] for gpu in gpus}
        return sizes.pop() if len(sizes) == 1 else 0

    def give_back(self, demand: Demand, gpus: tuple[int, ...]) -> None:
        """Undo a placement of ``demand`` on ``gpus`` that was only a question."""
        for gpu in gpus:
            self.free[gpu] += self.need(demand, gpu)

    def held(self, grant: Grant) -> tuple[tuple[int, int], ...]:
        """``(gpu, units)`` that ``grant`` holds on each of its GPUs (what to release)."""
        if grant.units:
            return tuple((gpu, grant.units) for gpu in grant.gpus)
        return tuple((gpu, self.totals[gpu]) for gpu in grant.gpus)

    def idle_count(self) -> int:
        """How many GPUs are completely free."""
        free = self.free
        if self.uniform:
            return free.count(self.units_per_gpu)
        return sum(1 for f, total in zip(free, self.totals, strict=True) if f == total)

    def one_per_memory(self, gpus: Iterable[int]) -> list[int]:
        """``gpus`` in their order, less each GPU whose memory group an earlier one has
        (rule 13: whole GPUs of one grant never share a memory)."""
        if not self.sibling_of:
            return list(gpus)
        kept: list[int] = []
        seen: set[int] = set()
        for gpu in gpus:
            if gpu not in seen:
                kept.append(gpu)
                seen.add(gpu)
                seen.update(self.sibling_of.get(gpu, ()))
        return kept

    def close_siblings(self, open_gpus: list[int], reserved: tuple[int, ...]) -> None:
        """Take the other GPUs of the memory groups of ``reserved`` out of ``open_gpus``
        (rule 13: nothing new draws on a reserved GPU's memory)."""
        for gpu in reserved:
            for other in self.sibling_of.get(gpu, ()):
                if other in open_gpus:
                    open_gpus.remove(other)

    # ------------------------------------------------------------ clock
    def time(self, now: object) -> float:
        """``now`` checked (a finite real number), or the current clock for None."""
        if now is None:
            return self.now
        number = check_real("now", now)
        if not math.isfinite(number):
            raise ValueError(f"now must be finite, got {now!r}")
        return number

    def commit(self, clock: float) -> float:
        """Advance the clock to ``clock`` (never back); return the time to act at."""
        self.now = max(self.now, clock)
        return self.now

    # ------------------------------------------------------------ checks of what comes back
    def check_gpu(self, gpu: object) -> int:
        return check_int("gpu_id", gpu, minimum=0, maximum=self.num_gpus - 1)

    @staticmethod
    def check_units(units: object) -> int:
        return check_int("units to release", units, minimum=1)

    def check_release(self, gpu: int, units: object) -> int:
        number = self.check_units(units)
        free = self.free
        held = free.held[gpu] if isinstance(free, SharedFree) else self.totals[gpu] - free[gpu]
        if number > held:
            raise ValueError(f"cannot release {number} units on GPU {gpu}: only {held} held")
        return number

    @staticmethod
    def check_ticket(ticket: object) -> None:
        if ticket is not None and type(ticket) is not int:
            raise TypeError(f"ticket must be an int or None, got {ticket!r}")

    def checked_grants(
        self, held: Iterable[tuple[int, Iterable[tuple[int, int]]]]
    ) -> list[BookedGrant]:
        """The grants a rebuild is given, each checked: an int ticket, known and distinct
        GPUs, units >= 1 (changing nothing; :meth:`check_taken` checks them together)."""
        return [(ticket, self._checked_parts(ticket, parts)) for ticket, parts in held]

    def check_taken(self, grants: list[BookedGrant]) -> None:
        """ValueError unless ``grants`` together hold at most each GPU's total, and at most
        each memory group's capacity on its GPUs together (rule 13)."""
        taken = [0] * self.num_gpus
        for _, parts in grants:
            for gpu, units in parts:
                taken[gpu] += units
        for gpu, units in enumerate(taken):
            if units > self.totals[gpu]:
                raise ValueError(
                    f"cannot hold {units} units on GPU {gpu}: its total is {self.totals[gpu]}"
                )
        for gpus in self.shared or ():
            self._check_memory(gpus, sum(taken[gpu] for gpu in gpus), 0)

    def check_memory_room(self, units_on: dict[int, int]) -> None:
        """ValueError unless ``units_on`` (units per GPU) fits, added to what is held now,
        in each memory group's capacity (rule 13: the GPUs of one share it)."""
        if not isinstance(self.free, SharedFree):
            return
        for gpus, _, used in self.free.group_held():
            self._check_memory(gpus, sum(units_on.get(gpu, 0) for gpu in gpus), used)

    def _check_memory(self, gpus: tuple[int, ...], need: int, used: int) -> None:
        capacity = self.totals[gpus[0]]
        if need and used + need > capacity:
            raise ValueError(
                f"cannot hold {need} units on GPUs {list(gpus)}, which share one memory of "
                f"{capacity} units ({used} held there already)"
            )

    def _checked_parts(
        self, ticket: object, parts: Iterable[tuple[int, int]]
    ) -> tuple[tuple[int, int], ...]:
        check_rebuilt_ticket(ticket)
        checked = tuple((self.check_gpu(gpu), self.check_units(units)) for gpu, units in parts)
        gpus = [gpu for gpu, _ in checked]
        if not gpus or len(set(gpus)) != len(gpus):
            raise ValueError(
                f"grant {ticket!r} must hold distinct GPUs, at least one, got {list(checked)}"
            )
        return checked


def check_rebuilt_ticket(ticket: object) -> int:
    """``ticket`` as an int, or TypeError naming it."""
    if type(ticket) is not int:
        raise TypeError(f"ticket must be an int, got {ticket!r}")
    return ticket
