"""Admission: a demand checked and put in the form the policies take, or refused (rules 1,
11, 12, 13).

:class:`Admission` refuses, with an error naming the argument and the value and changing
nothing, what could never fit (more units than the largest GPU, more whole GPUs than there
are, or than one group or distinct memories hold) and what its owner's limits refuse (a
request bigger than the limit, one beyond ``queued``, and under ``mode="refuse"`` one beyond
what the owner holds and has waiting). On GPUs of one size it turns whole-GPU and relative
demands into the equal absolute ones, so the policies' fast paths see nothing new. Rules
kept: 1 (what can never fit), 11 (refusals), 12 and 13 (counts within a group, per memory).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping

from .._check import check_int, check_real
from ._books import Books
from ._capacity import UNITS_PER_GPU
from ._holds import OwnerHolds
from ._limits import EPSILON, LimitExceeded
from ._order import QueueOrder
from ._requests import Demand, share

__all__ = ["Admission", "check_limit"]


def check_limit(limit: object) -> None:
    """TypeError/ValueError naming ``limit`` unless it is a finite real number > 0."""
    number = check_real("limit", limit)
    if not 0.0 < number < math.inf:
        raise ValueError(f"limit must be a finite number of seconds > 0, got {limit!r}")


def check_owner(demand: Demand) -> None:
    """TypeError naming the value for an owner that cannot be hashed or a priority that is
    not an int."""
    try:
        hash(demand.owner)
    except TypeError:
        raise TypeError(
            f"owner must be hashable, got {demand.owner!r} ({type(demand.owner).__name__})"
        ) from None
    if type(demand.priority) is not int:
        check_int("priority", demand.priority)  # TypeError naming it, if no integer
        raise TypeError(
            f"priority must be a Python int, got {demand.priority!r} "
            f"({type(demand.priority).__name__}); the fronts convert other integers"
        )


class Admission:
    """Checks demands and refuses what can never run or what limits refuse."""

    def __init__(self, books: Books, holds: OwnerHolds, order: QueueOrder) -> None:
        self.books = books
        self.holds = holds
        self.order = order

    def admit(self, demand: Demand) -> Demand:
        """``demand`` as the walk takes it, or ValueError if it could never fit.

        On GPUs of one size a whole-GPU demand is ``units_per_gpu`` on each and a relative
        demand its share of that, so the fast path sees nothing new; on GPUs of different
        sizes both keep their mark. ValueError for a relative demand of more than one GPU,
        of whole GPUs, or of a share outside 1..UNITS_PER_GPU units.
        """
        books = self.books
        count, units = demand.count, demand.units
        if demand.owner is not None or demand.priority.__class__ is not int or demand.priority:
            check_owner(demand)
            self.order.count_usage()
        if demand.limit is not None:
            check_limit(demand.limit)
        if demand.relative:
            return self._admit_relative(demand)
        if count > 1 or demand.whole:
            if not 1 <= count <= books.num_gpus:
                raise ValueError(
                    f"count must be between 1 and num_gpus={books.num_gpus} (whole GPUs), "
                    f"got {count}"
                )
            if books.groups is not None and count > 1:
                self._check_group_count(count)
            if books.shared is not None and count > 1:
                self._check_memory_count(count)
            if books.uniform:
                if units != books.units_per_gpu or demand.whole:
                    return Demand(
                        count,
                        books.units_per_gpu,
                        owner=demand.owner,
                        priority=demand.priority,
                        limit=demand.limit,
                    )
            elif count > 1 and not demand.whole:
                return Demand(
                    count,
                    units,
                    whole=True,
                    owner=demand.owner,
                    priority=demand.priority,
                    limit=demand.limit,
                )
            return demand
        if not 1 <= units <= books.units_per_gpu:
            raise ValueError(
                f"units must be between 1 and {books.units_per_gpu} (the largest GPU), got {units}"
            )
        return demand

    def _check_group_count(self, count: int) -> None:
        """ValueError unless some group has ``count`` GPUs (rule 12)."""
        largest = max(len(gpus) for gpus in self.books.groups or ())
        if count > largest:
            raise ValueError(
                f"count must be at most {largest} (whole GPUs within one group: the largest "
                f"group has {largest}), got {count}"
            )

    def _check_memory_count(self, count: int) -> None:
        """ValueError unless there are ``count`` GPUs that share no memory (rule 13)."""
        books = self.books
        distinct = books.num_gpus - sum(len(gpus) - 1 for gpus in books.shared or ())
        if count > distinct:
            raise ValueError(
                f"count must be at most {distinct} (whole GPUs that share no memory: "
                f"{books.num_gpus} GPUs, {distinct} memories), got {count}"
            )

    def _admit_relative(self, demand: Demand) -> Demand:
        """A relative demand checked: the equal absolute one on GPUs of one size."""
        count, units = demand.count, demand.units
        if count != 1 or demand.whole:
            raise ValueError(
                f"a relative demand is a share of one GPU: count must be 1 and whole False, "
                f"got count={count!r}, whole={demand.whole!r}"
            )
        if type(units) is not int or not 1 <= units <= UNITS_PER_GPU:
            raise ValueError(
                f"units of a relative demand must be between 1 and {UNITS_PER_GPU} "
                f"(a whole GPU), got {units!r}"
            )
        if self.books.uniform:
            return Demand(
                1,
                share(units, self.books.units_per_gpu),
                owner=demand.owner,
                priority=demand.priority,
                limit=demand.limit,
            )
        return demand

    # --------------------------------------------------------- limits (rule 11)
    def _refuse_never(self, demand: Demand) -> None:
        """LimitExceeded if ``demand`` asks more GPUs or units than its owner may ever hold."""
        holds = self.holds
        limits = holds.limits_of(demand.owner)
        if limits is None:
            return
        if limits.units is not None and holds.unit_charge(demand) > limits.units:
            asks = holds.unit_charge(demand)
            raise LimitExceeded(
                demand.owner, "units", limits.units, asks,
                f"a request for {asks} could never run",
            )  # fmt: skip
        if limits.gpus is None:
            return
        need = holds.charge(demand)
        if need > limits.gpus + EPSILON:
            raise LimitExceeded(
                demand.owner, "gpus", limits.gpus, need,
                f"a request for {need:g} GPU{'' if need == 1 else 's'} could never run",
            )  # fmt: skip

    def refuse_beyond(self, demand: Demand, would_wait: Callable[[], bool] | None) -> None:
        """LimitExceeded, changing nothing, for a request its owner's limits refuse (rule
        11): one that could never run; under ``mode="refuse"``, one beyond the ``gpus`` or
        ``running`` limit counting what the owner holds and has waiting; given
        ``would_wait`` (a submit, not a grant_now), one that would wait beyond the
        ``queued`` limit."""
        self._refuse_never(demand)
        owner, holds, usage = demand.owner, self.holds, self.holds.usage
        limits = holds.limits_of(owner)
        if limits is None:
            return
        count, asked, asked_units = self.order.waiting_of.get(owner, (0.0, 0.0, 0.0))
        waiting = int(count)
        if limits.mode == "refuse":
            grants = usage.grants(owner)
            if limits.running is not None and grants + waiting + 1 > limits.running:
                raise LimitExceeded(
                    owner, "running", limits.running, grants + waiting + 1,
                    f"it has {grants} running and {waiting} waiting, and refuses more",
                )  # fmt: skip
            held = usage.running(owner)
            need = holds.charge(demand)
            if limits.gpus is not None and held + asked + need > limits.gpus + EPSILON:
                raise LimitExceeded(
                    owner, "gpus", limits.gpus, held + asked + need,
                    f"it holds {held:g} and asks {asked:g} waiting, and this request "
                    f"asks {need:g} more",
                )  # fmt: skip
            held_units, asks = usage.units(owner), holds.unit_charge(demand)
            if limits.units is not None and held_units + asked_units + asks > limits.units:
                raise LimitExceeded(
                    owner, "units", limits.units, held_units + asked_units + asks,
                    f"it holds {held_units} and asks {asked_units:g} waiting, and this "
                    f"request asks {asks} more",
                )  # fmt: skip
        if (
            would_wait is not None
            and limits.queued is not None
            and waiting >= limits.queued
            and would_wait()
        ):
            raise LimitExceeded(
                owner, "queued", limits.queued, waiting + 1,
                f"it has {waiting} waiting, and this request would wait",
            )  # fmt: skip

    def check_restore(self, owner: Hashable, held: Mapping[int, int]) -> None:
        """LimitExceeded, changing nothing, where taking back a grant holding ``held`` (GPU ->
        units) would take ``owner`` past its ``gpus``, ``running`` or ``units`` limit (rule
        11), whatever its mode: a grant that is held already cannot wait."""
        limits = self.holds.limits_of(owner)
        if limits is None:
            return
        usage, totals = self.holds.usage, self.books.totals
        grants = usage.grants(owner)
        if limits.running is not None and grants + 1 > limits.running:
            raise LimitExceeded(
                owner, "running", limits.running, grants + 1,
                f"it holds {grants} and this lease would be one more",
            )  # fmt: skip
        has, adds = usage.running(owner), sum(u / totals[g] for g, u in held.items())
        if limits.gpus is not None and has + adds > limits.gpus + EPSILON:
            raise LimitExceeded(
                owner, "gpus", limits.gpus, has + adds,
                f"it holds {has:g} and this lease holds {adds:g}",
            )  # fmt: skip
        units, more = usage.units(owner), sum(held.values())
        if limits.units is not None and units + more > limits.units:
            raise LimitExceeded(
                owner, "units", limits.units, units + more,
                f"it holds {units} and this lease holds {more}",
            )  # fmt: skip
