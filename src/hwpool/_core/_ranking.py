"""The indexes ``reserve-all``'s walk keeps (rule 5): GPUs ranked most free first, and the
sizes of the demands waiting, so a walk stops as soon as nothing further back can fit.
Rule kept: 5 (the early stop), for :mod:`~hwpool._core._reserve_all`.
"""

from __future__ import annotations

import bisect

from ._requests import Demand, share

__all__ = ["DemandIndex", "Ranking", "index_key"]


def index_key(demand: Demand, smallest: int) -> int:
    """``demand``'s key in its index: a count of whole GPUs, else the units it needs on the
    GPU where it needs the fewest (``smallest``: the smallest total; a lower bound, which
    keeps the early stop safe)."""
    if demand.count > 1 or demand.whole:
        return demand.count
    if demand.relative:
        return share(demand.units, smallest)
    return demand.units


class DemandIndex:
    """A multiset of waiting demand sizes with its minimum, kept sorted for suffix queries."""

    __slots__ = ("counts", "keys")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.keys: list[int] = []

    def add(self, key: int) -> None:
        n = self.counts.get(key, 0)
        if n == 0:
            bisect.insort(self.keys, key)
        self.counts[key] = n + 1

    def remove(self, key: int) -> None:
        n = self.counts[key] - 1
        if n == 0:
            del self.counts[key]
            del self.keys[bisect.bisect_left(self.keys, key)]
        else:
            self.counts[key] = n

    def min_excluding(self, visited: dict[int, int]) -> int | None:
        """The smallest key with members left once ``visited`` ones are taken out."""
        for key in self.keys:
            if self.counts[key] > visited.get(key, 0):
                return key
        return None


class Ranking:
    """GPUs sorted by most free first (ties: lowest index); ``gpus[p:]`` are unreserved.

    Walking the queue consumes this from the front: a waiter that cannot be granted reserves
    the next 1 (or ``count``) GPUs, so each non-fitting waiter costs O(1).
    """

    __slots__ = ("free", "gpus", "p", "reserving")

    def __init__(self, free: list[int]) -> None:
        self.free = free
        self.gpus: list[int] = []
        self.p = 0
        self.reserving = True
        self.reset()

    def reset(self) -> None:
        """Rank every GPU afresh, with nothing reserved."""
        # A stable sort keeps equal capacities in index order, as the ranking requires.
        self.gpus = sorted(range(len(self.free)), key=self.free.__getitem__, reverse=True)
        self.p = 0
        self.reserving = True

    def open_count(self) -> int:
        return len(self.gpus) - self.p

    def top_free(self) -> int:
        """Free units of the most free unreserved GPU (-1 when all are reserved)."""
        return self.free[self.gpus[self.p]] if self.p < len(self.gpus) else -1

    def full_count_at_least(self, count: int, full: int) -> bool:
        """Whether at least ``count`` unreserved GPUs are completely free."""
        last = self.p + count - 1
        return last < len(self.gpus) and self.free[self.gpus[last]] == full

    def best_fit(self, units: int) -> int | None:
        """Position of the unreserved GPU with the least free >= units (ties: lowest index)."""
        gpus, free = self.gpus, self.free
        i = len(gpus) - 1
        while i >= self.p and free[gpus[i]] < units:
            i -= 1
        if i < self.p:
            return None
        value = free[gpus[i]]
        while i > self.p and free[gpus[i - 1]] == value:
            i -= 1
        return i

    def reposition(self, start: int, stop: int) -> None:
        """Re-sort the GPUs at positions ``start:stop`` after their free capacity fell.

        Each sinks past the GPUs that now rank before it (an insertion-sort step: with a
        handful of GPUs this beats a keyed bisect).
        """
        gpus, free = self.gpus, self.free
        for i in range(stop - 1, start - 1, -1):
            gpu = gpus[i]
            f = free[gpu]
            j = i + 1
            while j < len(gpus) and (free[gpus[j]] > f or (free[gpus[j]] == f and gpus[j] < gpu)):
                j += 1
            if j > i + 1:
                gpus.insert(j, gpu)
                del gpus[i]

    def reserve(self, count: int) -> tuple[int, ...] | None:
        """Reserve the ``count`` most free unreserved GPUs, or stop reserving if too few."""
        if not self.reserving or self.open_count() < count:
            self.reserving = False
            return None
        chosen = self.gpus[self.p : self.p + count]
        self.p += count
        return tuple(sorted(chosen))
