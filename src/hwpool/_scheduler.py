"""The GPU scheduling core: a pure, synchronous state machine (no I/O, no clock, no threads).

Every front (asyncio, blocking threads, the virtual-time simulator) drives this one class and
turns the grants it returns into woken waiters. The policy, in the order it is applied:

1. A demand needs ``count`` GPUs, each with at least ``units`` free. A fractional demand is
   ``count == 1``; a whole-GPU demand of n GPUs is ``count == n`` with ``units`` a whole GPU.
2. Placement is best fit: the fitting GPUs with the least free capacity, ties to the lowest
   index (for whole GPUs, this is simply the lowest-indexed free GPUs).
3. Waiters form one FIFO queue. Walking it in order, each waiter that cannot be granted
   reserves, among the GPUs no earlier waiter reserves, the ``count`` GPUs with the most free
   capacity (ties: lowest index). The first waiter that cannot get its full set stops all
   reservations behind it.
4. Any request may be granted at once on GPUs that no earlier waiter reserves (backfill).
5. Every release or cancellation walks the queue again, granting what now fits. The walk stops
   as soon as no unreserved GPU can serve anything further back, which it knows from a sorted
   index of the demands still waiting, without scanning them.

Invariants after every call: per GPU ``0 <= free <= total``; a ticket is waiting, granted or
gone, never two; reservations are disjoint and held only by waiters.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ._capacity import UNITS_PER_GPU

__all__ = ["Demand", "Grant", "Scheduler", "Waiter"]


@dataclass(frozen=True, slots=True)
class Demand:
    """What one request needs: ``count`` GPUs with ``units`` free on each."""

    count: int
    units: int

    @property
    def is_whole(self) -> bool:
        """True for a whole-GPU demand of more than one GPU."""
        return self.count > 1


@dataclass(frozen=True, slots=True)
class Grant:
    """A request that has been granted: ``units`` taken on each GPU of ``gpus``."""

    ticket: int
    gpus: tuple[int, ...]
    units: int


@dataclass(frozen=True, slots=True)
class Waiter:
    """A waiting request as the core sees it: its queue position, demand and reservation."""

    ticket: int
    demand: Demand
    reserved: tuple[int, ...]


class _DemandIndex:
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


class Scheduler:
    """The FIFO-with-reservations, best-fit, backfilling GPU scheduler.

    ``submit`` and ``grant_now`` take new requests, ``release`` and ``cancel`` report what
    finished or gave up; each returns the grants it made so the caller can wake those waiters.
    Bad input raises ValueError and leaves the state unchanged.
    """

    def __init__(self, num_gpus: int, units_per_gpu: int = UNITS_PER_GPU) -> None:
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 1:
            raise ValueError(f"num_gpus must be an int >= 1, got {num_gpus!r}")
        if isinstance(units_per_gpu, bool) or not isinstance(units_per_gpu, int):
            raise TypeError(f"units_per_gpu must be an int, got {units_per_gpu!r}")
        if units_per_gpu < 1:
            raise ValueError(f"units_per_gpu must be >= 1, got {units_per_gpu!r}")
        self.num_gpus = num_gpus
        self.units_per_gpu = units_per_gpu
        self._free = [units_per_gpu] * num_gpus
        self._queue: dict[int, Demand] = {}
        self._reserved: dict[int, tuple[int, ...]] = {}
        self._fraction_index = _DemandIndex()  # units of waiting single-GPU demands
        self._whole_index = _DemandIndex()  # counts of waiting multi-GPU demands
        # What a new arrival at the tail of the queue sees; kept current by every change.
        self._tail_unreserved: list[int] = list(range(num_gpus))
        self._tail_reserving = True
        self._tickets = itertools.count(1)

    # ----------------------------------------------------------------- queries
    @property
    def free(self) -> tuple[int, ...]:
        """Free units per GPU."""
        return tuple(self._free)

    @property
    def queue_length(self) -> int:
        """How many requests are waiting."""
        return len(self._queue)

    def is_waiting(self, ticket: int) -> bool:
        """Whether ``ticket`` is in the queue."""
        return ticket in self._queue

    def waiters(self) -> Iterator[Waiter]:
        """The waiting requests in queue order, with their current reservations."""
        for ticket, demand in self._queue.items():
            yield Waiter(ticket, demand, self._reserved.get(ticket, ()))

    def reservations(self) -> dict[int, tuple[int, ...]]:
        """Reserved GPUs per waiting ticket (waiters that reserve nothing are absent)."""
        return dict(self._reserved)

    # ----------------------------------------------------------------- inputs
    def demand(self, count: int, units: int) -> Demand:
        """A validated demand: ``count`` GPUs with ``units`` each (whole GPUs if count > 1)."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, got {count!r}")
        if not 1 <= count <= self.num_gpus:
            raise ValueError(f"count must be between 1 and num_gpus={self.num_gpus}, got {count}")
        if isinstance(units, bool) or not isinstance(units, int):
            raise TypeError(f"units must be an int, got {units!r}")
        if not 1 <= units <= self.units_per_gpu:
            raise ValueError(f"units must be in [1, {self.units_per_gpu}], got {units}")
        if count > 1 and units != self.units_per_gpu:
            raise ValueError(f"a demand for count={count} GPUs must take whole GPUs, got {units=}")
        return Demand(count, units)

    def grant_now(self, demand: Demand) -> Grant | None:
        """Grant ``demand`` where a new arrival would be granted at once, or return None.

        Never queues and never jumps the queue: only GPUs that no waiter reserves are used.
        """
        gpus = self._place(demand, self._tail_unreserved)
        if gpus is None:
            return None
        return self._take(next(self._tickets), demand, gpus)

    def submit(self, demand: Demand) -> tuple[int, Grant | None]:
        """Add a request; return its ticket and its grant if it was granted at once.

        A request not granted at once waits in the queue (and may reserve GPUs) until a later
        ``release`` or ``cancel`` grants it or it is cancelled.
        """
        ticket = next(self._tickets)
        gpus = self._place(demand, self._tail_unreserved)
        if gpus is not None:
            return ticket, self._take(ticket, demand, gpus)
        self._enqueue(ticket, demand)
        return ticket, None

    def release(self, gpu: int, units: int) -> list[Grant]:
        """Give back ``units`` on ``gpu``; return the waiters granted as a result."""
        return self.release_many([(gpu, units)])

    def release_many(self, releases: Iterable[tuple[int, int]]) -> list[Grant]:
        """Give back several ``(gpu, units)`` at once (all or nothing), then walk the queue once."""
        pending: dict[int, int] = {}
        for gpu, units in releases:
            self._check_gpu(gpu)
            if isinstance(units, bool) or not isinstance(units, int) or units <= 0:
                raise ValueError(f"units to release must be a positive int, got {units!r}")
            pending[gpu] = pending.get(gpu, 0) + units
        for gpu, units in pending.items():
            held = self.units_per_gpu - self._free[gpu]
            if units > held:
                raise ValueError(f"cannot release {units} units on GPU {gpu}: only {held} held")
        for gpu, units in pending.items():
            self._free[gpu] += units
        return self._walk() if self._queue else []

    def cancel(self, ticket: int) -> list[Grant]:
        """Withdraw a waiting request; return the waiters granted as a result.

        Raises KeyError if ``ticket`` is not waiting (it was granted, or never existed).
        """
        demand = self._queue.pop(ticket)
        self._index_of(demand).remove(self._key_of(demand))
        return self._walk()

    # ----------------------------------------------------------------- internals
    def _check_gpu(self, gpu: object) -> None:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < self.num_gpus:
            raise ValueError(f"gpu_id must be an int in [0, {self.num_gpus}), got {gpu!r}")

    def _index_of(self, demand: Demand) -> _DemandIndex:
        return self._whole_index if demand.count > 1 else self._fraction_index

    @staticmethod
    def _key_of(demand: Demand) -> int:
        return demand.count if demand.count > 1 else demand.units

    def _enqueue(self, ticket: int, demand: Demand) -> None:
        self._queue[ticket] = demand
        self._index_of(demand).add(self._key_of(demand))
        if self._tail_reserving and self._tail_unreserved:
            self._tail_reserving = self._reserve(ticket, demand, self._tail_unreserved)

    def _take(self, ticket: int, demand: Demand, gpus: tuple[int, ...]) -> Grant:
        for gpu in gpus:
            self._free[gpu] -= demand.units
        return Grant(ticket, gpus, demand.units)

    def _place(self, demand: Demand, candidates: list[int]) -> tuple[int, ...] | None:
        """Best-fit placement of ``demand`` on ``candidates``, or None if it does not fit."""
        free = self._free
        units = demand.units
        if demand.count == 1:
            best = -1
            for gpu in candidates:
                f = free[gpu]
                if f >= units and (best < 0 or f < free[best] or (f == free[best] and gpu < best)):
                    best = gpu
            return None if best < 0 else (best,)
        fitting = sorted(gpu for gpu in candidates if free[gpu] >= units)
        return tuple(fitting[: demand.count]) if len(fitting) >= demand.count else None

    def _reserve(self, ticket: int, demand: Demand, unreserved: list[int]) -> bool:
        """Reserve the most-free unreserved GPUs for ``ticket``; False if it cannot get its set."""
        if len(unreserved) < demand.count:
            return False
        free = self._free
        chosen = sorted(unreserved, key=lambda gpu: (-free[gpu], gpu))[: demand.count]
        for gpu in chosen:
            unreserved.remove(gpu)
        self._reserved[ticket] = tuple(sorted(chosen))
        return True

    def _could_serve_rest(
        self, unreserved: list[int], seen_fractions: dict[int, int], seen_wholes: dict[int, int]
    ) -> bool:
        """Whether any waiter not yet visited could fit on the unreserved GPUs."""
        free = self._free
        smallest = self._fraction_index.min_excluding(seen_fractions)
        if smallest is not None and any(free[gpu] >= smallest for gpu in unreserved):
            return True
        fewest = self._whole_index.min_excluding(seen_wholes)
        if fewest is None:
            return False
        return sum(1 for gpu in unreserved if free[gpu] == self.units_per_gpu) >= fewest

    def _walk(self) -> list[Grant]:
        """Recompute reservations in queue order and grant every waiter that fits (rules 3-5)."""
        self._reserved.clear()
        grants: list[Grant] = []
        unreserved = list(range(self.num_gpus))
        reserving = True
        seen_fractions: dict[int, int] = {}
        seen_wholes: dict[int, int] = {}
        for ticket, demand in self._queue.items():
            if not unreserved:
                break
            if not reserving and not self._could_serve_rest(
                unreserved, seen_fractions, seen_wholes
            ):
                break
            seen = seen_wholes if demand.count > 1 else seen_fractions
            key = self._key_of(demand)
            seen[key] = seen.get(key, 0) + 1
            gpus = self._place(demand, unreserved)
            if gpus is not None:
                grants.append(self._take(ticket, demand, gpus))
            elif reserving:
                reserving = self._reserve(ticket, demand, unreserved)
        for grant in grants:
            demand = self._queue.pop(grant.ticket)
            self._index_of(demand).remove(self._key_of(demand))
        self._tail_unreserved = unreserved
        self._tail_reserving = reserving
        return grants
