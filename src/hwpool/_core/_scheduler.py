"""The GPU scheduling core: a pure, synchronous state machine (no I/O, no clock, no threads).

Every front (asyncio, blocking threads, the virtual-time simulator) drives this one class and
turns the grants it returns into woken waiters. The policy, in the order it is applied:

GPUs may differ in size: each has its own total of units (``Scheduler.totals``).

1. A demand needs ``count`` GPUs, each with at least ``units`` free. A fractional demand is
   ``count == 1``; a whole-GPU demand (``count > 1``, or ``whole=True``) needs ``count`` GPUs
   that are completely free, whatever their size. A demand that can never fit (more units
   than the largest GPU, more whole GPUs than there are) is refused with ValueError.
2. Placement is best fit: a fractional demand takes the fitting GPU with the fewest free
   units, a whole-GPU demand the completely free GPUs with the smallest totals; ties to the
   lowest index (on GPUs of one size: the lowest-indexed free GPUs).
3. Waiters form one FIFO queue. Walking it in order, each waiter that cannot be granted
   reserves, among the GPUs no earlier waiter reserves, the ``count`` most free ones: for a
   fractional demand the GPU with the most free units among those whose total could ever
   hold it, for a whole-GPU demand the GPUs with the fewest units in use (on GPUs of one size
   both are "most free"); ties to the lowest index. The first waiter that cannot get its full
   set stops all reservations behind it.
4. Any request may be granted at once on GPUs that no earlier waiter reserves (backfill).
5. Every release or cancellation walks the queue again, granting what now fits. The walk stops
   as soon as no unreserved GPU can serve anything further back, which it knows from a sorted
   index of the demands still waiting, without scanning them.

On GPUs of one size the walk below is the fast path; GPUs of different sizes take a plainer
walk that applies the same rules with these definitions.

Under ``policy="easy"`` (experimental, opt-in; the default ``"reserve-all"`` is the policy
above) rules 3 and 4 change, the rest stay:

3e. Only the head of the queue (the first waiter the walk cannot grant) reserves: the GPUs
    rule 3 would give it. It keeps them, across releases and arrivals, until it is granted or
    cancelled (no hopping to a GPU that became slightly freer).
4e. Any other request may be granted at once on any GPU the head does not reserve, however
    many wait. So the head starts, at the latest, once the grants on its reserved GPUs end.

Invariants after every call: per GPU ``0 <= free <= total``; a ticket is waiting, granted or
gone, never two; reservations are disjoint and held only by waiters.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .._check import check_int
from ._capacity import UNITS_PER_GPU

__all__ = ["POLICIES", "Demand", "Grant", "Scheduler", "Waiter"]

POLICIES = ("reserve-all", "easy")
"""The core's policies by name: ``reserve-all`` (every waiter reserves; the default) and
``easy`` (only the head of the queue reserves, and keeps its GPUs; experimental)."""


@dataclass(frozen=True, slots=True)
class Demand:
    """What one request needs: ``count`` GPUs with ``units`` free on each.

    ``count > 1`` always means whole GPUs; ``whole=True`` asks for one (or ``count``) whole
    GPUs of any size, where ``units`` is not used for fitting.
    """

    count: int
    units: int
    whole: bool = False


class Grant(NamedTuple):
    """A request that has been granted: ``units`` taken on each GPU of ``gpus``.

    A whole-GPU grant holds each GPU's total; where those differ, ``units`` is 0 and
    :meth:`Scheduler.held` gives what each GPU holds.
    """

    ticket: int
    gpus: tuple[int, ...]
    units: int


# Grant((ticket, gpus, units)) without the Python frame of NamedTuple.__new__ (the hot path).
_grant = functools.partial(tuple.__new__, Grant)


class Waiter(NamedTuple):
    """A waiting request as the core sees it: its ticket, demand and current reservation."""

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


class _Order:
    """GPUs sorted by most free first (ties: lowest index); ``order[p:]`` are unreserved.

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


class Scheduler:
    """The FIFO-with-reservations, best-fit, backfilling GPU scheduler.

    ``submit`` and ``grant_now`` take new requests, ``release`` and ``cancel`` report what
    finished or gave up; each returns the grants it made so the caller can wake those waiters.
    Demands come validated from the fronts (GPUPool, the trace reader); a bad release or
    cancel raises ValueError or KeyError and leaves the state unchanged.
    """

    def __init__(
        self,
        gpus: int | Sequence[int],
        units_per_gpu: int | None = None,
        *,
        policy: str = "reserve-all",
    ) -> None:
        """``gpus``: a count of GPUs of ``units_per_gpu`` units each (default a whole GPU's
        ``UNITS_PER_GPU``), or a sequence giving each GPU's total in units (any positive
        ints; then ``units_per_gpu`` is not given and reads as the largest total).
        ``policy``: one of :data:`POLICIES` (see the module docstring).
        """
        if not isinstance(policy, str):
            raise TypeError(f"policy must be a str, got {policy!r} ({type(policy).__name__})")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
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
            totals = [check_int(f"gpus[{i}]", t, minimum=1) for i, t in enumerate(gpus)]
        else:
            count = check_int("gpus", gpus, minimum=1)
            size = UNITS_PER_GPU if units_per_gpu is None else units_per_gpu
            totals = [check_int("units_per_gpu", size, minimum=1)] * count
        self.num_gpus = len(totals)
        self.units_per_gpu = max(totals)  # every GPU's total when they are equal
        self._totals = totals
        self.policy = policy
        self._easy = policy == "easy"  # the plain walk, with only the head reserving
        self._uniform = len(set(totals)) == 1  # the fast path; else the plain walk
        self._free = list(totals)
        self._queue: OrderedDict[int, Demand] = OrderedDict()
        self._reserved: dict[int, tuple[int, ...]] = {}
        self._fraction_index = _DemandIndex()  # units of waiting single-GPU demands
        self._whole_index = _DemandIndex()  # counts of waiting multi-GPU demands
        # What a new arrival at the tail of the queue sees; meaningful only while some wait.
        self._tail = _Order(self._free)
        # The same for GPUs of different sizes: the GPUs no waiter reserves, and whether
        # the tail still reserves.
        self._open: list[int] = list(range(self.num_gpus))
        self._reserving = True
        self._tickets = itertools.count(1)

    # ----------------------------------------------------------------- queries
    @property
    def free(self) -> tuple[int, ...]:
        """Free units per GPU."""
        return tuple(self._free)

    @property
    def totals(self) -> tuple[int, ...]:
        """Each GPU's total units."""
        return tuple(self._totals)

    def held(self, grant: Grant) -> tuple[tuple[int, int], ...]:
        """``(gpu, units)`` that ``grant`` holds on each of its GPUs (what to release)."""
        if grant.units:
            return tuple((gpu, grant.units) for gpu in grant.gpus)
        return tuple((gpu, self._totals[gpu]) for gpu in grant.gpus)

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
    def grant_now(self, demand: Demand) -> Grant | None:
        """Grant ``demand`` where a new arrival would be granted at once, or return None.

        Never queues and never jumps the queue: only GPUs that no waiter reserves are used.
        Raises ValueError, changing nothing, for a demand that could never fit.
        """
        demand = self._admit(demand)
        gpus = self._take_new(demand)
        if gpus is None:
            return None
        return _grant((next(self._tickets), gpus, self._units_of(demand, gpus)))

    def submit(self, demand: Demand) -> tuple[int, Grant | None]:
        """Add a request; return its ticket and its grant if it was granted at once.

        A request not granted at once waits in the queue (and may reserve GPUs) until a later
        ``release`` or ``cancel`` grants it or it is cancelled. Raises ValueError, changing
        nothing, for a demand that could never fit.
        """
        demand = self._admit(demand)
        if not self._uniform or self._easy:
            return self._submit_general(demand)
        ticket = next(self._tickets)
        gpus = self._take_new(demand)
        if gpus is not None:
            return ticket, _grant((ticket, gpus, demand.units))
        if not self._queue:
            self._tail.reset()
        self._queue[ticket] = demand
        self._index_of(demand).add(self._key_of(demand))
        reserved = self._tail.reserve(demand.count)
        if reserved is not None:
            self._reserved[ticket] = reserved
        return ticket, None

    def release(self, gpu: int, units: int) -> list[Grant]:
        """Give back ``units`` on ``gpu``; return the waiters granted as a result."""
        free = self._free
        if not (
            type(gpu) is int
            and 0 <= gpu < self.num_gpus
            and type(units) is int
            and 0 < units <= self._totals[gpu] - free[gpu]
        ):  # the checks again, slowly, for the error message (and NumPy ints made ints)
            gpu = self._check_gpu(gpu)
            units = self._check_release(gpu, units)
        free[gpu] += units
        return self._walk() if self._queue else []

    def release_many(self, releases: Iterable[tuple[int, int]]) -> list[Grant]:
        """Give back several ``(gpu, units)`` at once (all or nothing), then walk the queue once."""
        pending: dict[int, int] = {}
        for raw_gpu, raw_units in releases:
            gpu = self._check_gpu(raw_gpu)
            units = self._check_units(raw_units)
            pending[gpu] = pending.get(gpu, 0) + units
        for gpu, units in pending.items():
            self._check_release(gpu, units)
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
    def _check_gpu(self, gpu: object) -> int:
        return check_int("gpu_id", gpu, minimum=0, maximum=self.num_gpus - 1)

    @staticmethod
    def _check_units(units: object) -> int:
        return check_int("units to release", units, minimum=1)

    def _check_release(self, gpu: int, units: object) -> int:
        number = self._check_units(units)
        held = self._totals[gpu] - self._free[gpu]
        if number > held:
            raise ValueError(f"cannot release {number} units on GPU {gpu}: only {held} held")
        return number

    def _admit(self, demand: Demand) -> Demand:
        """``demand`` as the walk takes it, or ValueError if it could never fit.

        On GPUs of one size a whole-GPU demand is ``units_per_gpu`` on each, so the fast
        path sees nothing new; on GPUs of different sizes it keeps its ``whole`` mark.
        """
        count, units = demand.count, demand.units
        if count > 1 or demand.whole:
            if not 1 <= count <= self.num_gpus:
                raise ValueError(
                    f"count must be between 1 and num_gpus={self.num_gpus} (whole GPUs), "
                    f"got {count}"
                )
            if self._uniform:
                if units != self.units_per_gpu or demand.whole:
                    return Demand(count, self.units_per_gpu)
            elif count > 1 and not demand.whole:
                return Demand(count, units, whole=True)
            return demand
        if not 1 <= units <= self.units_per_gpu:
            raise ValueError(
                f"units must be between 1 and {self.units_per_gpu} (the largest GPU), got {units}"
            )
        return demand

    def _index_of(self, demand: Demand) -> _DemandIndex:
        return self._whole_index if demand.count > 1 or demand.whole else self._fraction_index

    @staticmethod
    def _key_of(demand: Demand) -> int:
        return demand.count if demand.count > 1 or demand.whole else demand.units

    def _take_new(self, demand: Demand) -> tuple[int, ...] | None:
        """Take capacity for a new arrival where it fits without jumping the queue, or None."""
        if not self._uniform or self._easy:
            return self._fit_general(demand, self._open if self._queue else None, take=True)
        count, units = demand.count, demand.units
        if self._queue:
            return self._take_in(self._tail, count, units)
        free = self._free
        if count == 1:  # nobody waits: best fit over every GPU
            least = min(free)
            if least >= units:  # every GPU fits: the least free, lowest index (all in C)
                best = free.index(least)
            else:
                best, best_free = -1, self.units_per_gpu + 1
                for gpu, f in enumerate(free):
                    if units <= f < best_free:
                        best, best_free = gpu, f
                if best < 0:
                    return None
            free[best] -= units
            return (best,)
        fitting = [gpu for gpu, f in enumerate(free) if f == self.units_per_gpu][:count]
        if len(fitting) < count:
            return None
        for gpu in fitting:
            free[gpu] = 0
        return tuple(fitting)

    def _take_in(self, order: _Order, count: int, units: int) -> tuple[int, ...] | None:
        """Take best-fit capacity on the unreserved GPUs of ``order``, keeping it sorted."""
        if count == 1:
            if order.top_free() < units:
                return None
            i = order.best_fit(units)
            assert i is not None
            gpu = order.gpus[i]
            self._free[gpu] -= units
            order.reposition(i, i + 1)
            return (gpu,)
        if not order.full_count_at_least(count, self.units_per_gpu):
            return None
        # The first `count` unreserved GPUs are the lowest-indexed completely free ones.
        gpus = tuple(order.gpus[order.p : order.p + count])
        for gpu in gpus:
            self._free[gpu] = 0
        order.reposition(order.p, order.p + count)
        return gpus

    def _could_serve_rest(self, order: _Order, seen: tuple[dict[int, int], dict[int, int]]) -> bool:
        """Whether any waiter not yet visited could fit on the unreserved GPUs."""
        smallest = self._fraction_index.min_excluding(seen[0])
        if smallest is not None and order.top_free() >= smallest:
            return True
        fewest = self._whole_index.min_excluding(seen[1])
        return fewest is not None and order.full_count_at_least(fewest, self.units_per_gpu)

    @staticmethod
    def _tally(seen: tuple[dict[int, int], dict[int, int]], demand: Demand) -> None:
        whole = demand.count > 1 or demand.whole
        counts = seen[1] if whole else seen[0]
        key = demand.count if whole else demand.units
        counts[key] = counts.get(key, 0) + 1

    def _walk(self) -> list[Grant]:
        """Recompute reservations in queue order and grant every waiter that fits (rules 3-5).

        This runs on every release, so the common step (a single-GPU waiter that does not fit
        and reserves the next most-free GPU) is written out inline. Once reservations stop,
        the walk counts the demands it has passed, to stop when nothing further back can fit.
        """
        if not self._uniform or self._easy:
            return self._walk_general()
        reserved = self._reserved
        reserved.clear()
        grants: list[Grant] = []
        free = self._free
        order = self._tail  # rebuilt here, and left as what a new arrival sees
        order.reset()
        gpus = order.gpus
        n = self.num_gpus
        visited = 0
        seen: tuple[dict[int, int], dict[int, int]] | None = None
        p = 0  # order.p, kept in a local on the hot path
        for ticket, demand in self._queue.items():
            if p == n:
                break
            if seen is not None:
                order.p = p
                if not self._could_serve_rest(order, seen):
                    break
                self._tally(seen, demand)
            visited += 1
            count, units = demand.count, demand.units
            if count == 1 and free[gpus[p]] < units:  # fits nowhere open
                if seen is None:  # still reserving: take the most free open GPU
                    reserved[ticket] = (gpus[p],)
                    p += 1
                continue
            order.p = p
            taken = self._take_in(order, count, units)
            if taken is not None:
                grants.append(_grant((ticket, taken, units)))
                continue
            chosen = order.reserve(count)
            p = order.p
            if chosen is not None:
                reserved[ticket] = chosen
            elif seen is None:  # reservations stop here: count what the walk has passed
                seen = ({}, {})
                for passed in itertools.islice(self._queue.values(), visited):
                    self._tally(seen, passed)
        order.p = p
        for grant in grants:
            demand = self._queue.pop(grant.ticket)
            self._index_of(demand).remove(self._key_of(demand))
        return grants

    # ------------------------------------------------- GPUs of different sizes (plain walk)
    def _units_of(self, demand: Demand, gpus: tuple[int, ...]) -> int:
        """``Grant.units`` for ``demand`` on ``gpus``: 0 for whole GPUs of different sizes."""
        if not demand.whole:
            return demand.units
        sizes = {self._totals[gpu] for gpu in gpus}
        return sizes.pop() if len(sizes) == 1 else 0

    def _fit_general(
        self, demand: Demand, open_gpus: list[int] | None, *, take: bool
    ) -> tuple[int, ...] | None:
        """Best-fit GPUs for ``demand`` among ``open_gpus`` (None: all), taken if ``take``."""
        free, totals = self._free, self._totals
        gpus = range(self.num_gpus) if open_gpus is None else open_gpus
        if demand.whole or demand.count > 1:
            idle = [gpu for gpu in gpus if free[gpu] == totals[gpu]]
            if len(idle) < demand.count:
                return None
            chosen = tuple(sorted(sorted(idle, key=totals.__getitem__)[: demand.count]))
            if take:
                for gpu in chosen:
                    free[gpu] = 0
            return chosen
        units, best, best_free = demand.units, -1, -1
        for gpu in gpus:
            f = free[gpu]
            if f >= units and (best < 0 or f < best_free or (f == best_free and gpu < best)):
                best, best_free = gpu, f
        if best < 0:
            return None
        if take:
            free[best] -= units
        return (best,)

    def _reserve_general(self, demand: Demand, open_gpus: list[int]) -> tuple[int, ...] | None:
        """The GPUs ``demand`` reserves among ``open_gpus`` (rule 3), removed from it."""
        free, totals = self._free, self._totals
        if demand.whole or demand.count > 1:
            if len(open_gpus) < demand.count:
                return None
            ranked = sorted(open_gpus, key=lambda gpu: (totals[gpu] - free[gpu], gpu))
            chosen = tuple(sorted(ranked[: demand.count]))
            for gpu in chosen:
                open_gpus.remove(gpu)
            return chosen
        units, best, best_free = demand.units, -1, -1  # the most free GPU that could hold it
        for gpu in open_gpus:
            if totals[gpu] >= units:
                f = free[gpu]
                if f > best_free or (f == best_free and gpu < best):
                    best, best_free = gpu, f
        if best < 0:
            return None
        open_gpus.remove(best)
        return (best,)

    def _submit_general(self, demand: Demand) -> tuple[int, Grant | None]:
        ticket = next(self._tickets)
        gpus = self._take_new(demand)
        if gpus is not None:
            return ticket, _grant((ticket, gpus, self._units_of(demand, gpus)))
        if not self._queue:
            self._open = list(range(self.num_gpus))
            self._reserving = True
        self._queue[ticket] = demand
        self._index_of(demand).add(self._key_of(demand))
        if self._reserving:
            chosen = self._reserve_general(demand, self._open)
            if chosen is None:
                self._reserving = False
            else:
                self._reserved[ticket] = chosen
            if self._easy:  # only the head reserves (rule 3e)
                self._reserving = False
        return ticket, None

    def _could_serve_rest_general(
        self, open_gpus: list[int], seen: tuple[dict[int, int], dict[int, int]]
    ) -> bool:
        """Whether any waiter not yet visited could fit on ``open_gpus``."""
        free, totals = self._free, self._totals
        smallest = self._fraction_index.min_excluding(seen[0])
        if smallest is not None and any(free[gpu] >= smallest for gpu in open_gpus):
            return True
        fewest = self._whole_index.min_excluding(seen[1])
        idle = sum(1 for gpu in open_gpus if free[gpu] == totals[gpu])
        return fewest is not None and idle >= fewest

    def _seen_upto(self, visited: int) -> tuple[dict[int, int], dict[int, int]]:
        """The demands of the first ``visited`` waiters, tallied for the early stop."""
        seen: tuple[dict[int, int], dict[int, int]] = ({}, {})
        for passed in itertools.islice(self._queue.values(), visited):
            self._tally(seen, passed)
        return seen

    def _walk_general(self) -> list[Grant]:  # noqa: PLR0915 (one pass; split in issue 9)
        """Rules 3-5 on GPUs of different sizes, with the same early stop as the fast walk.

        Under ``easy`` (on any GPUs) only the first waiter not granted reserves, and a head
        that reserved before keeps the GPUs it had (rule 3e).
        """
        reserved = self._reserved
        kept = dict(reserved) if self._easy else {}
        reserved.clear()
        free, totals = self._free, self._totals
        grants: list[Grant] = []
        open_gpus = list(range(self.num_gpus))
        reserving = True
        seen: tuple[dict[int, int], dict[int, int]] | None = None
        visited = 0
        # Under easy, past the head: the smallest fraction and whole count that did not fit.
        # Free units only fall during the walk, so no later demand as large fits either.
        failed_units, failed_count = self.units_per_gpu + 1, self.num_gpus + 1
        easy = self._easy
        for ticket, demand in self._queue.items():
            if not open_gpus:
                break
            visited += 1
            if seen is not None:
                whole = demand.whole or demand.count > 1
                if easy and (
                    demand.count >= failed_count if whole else demand.units >= failed_units
                ):
                    self._tally(seen, demand)
                    continue
                if not self._could_serve_rest_general(open_gpus, seen):
                    break
                self._tally(seen, demand)
            if demand.count == 1 and not demand.whole:  # one pass: best fit, else the reserve
                units, fit, fit_free, most, most_free = demand.units, -1, -1, -1, -1
                for gpu in open_gpus:  # in index order, so ties go to the lowest index
                    f = free[gpu]
                    if f >= units:
                        if fit < 0 or f < fit_free:
                            fit, fit_free = gpu, f
                    elif f > most_free and totals[gpu] >= units:
                        most, most_free = gpu, f
                if fit >= 0:
                    free[fit] -= units
                    grants.append(_grant((ticket, (fit,), units)))
                    continue
                if seen is not None and easy:
                    failed_units = min(failed_units, units)
                if reserving:
                    chosen = kept.get(ticket)  # rule 3e: a head keeps the GPU it reserved
                    if chosen is not None and chosen[0] in open_gpus:
                        most = chosen[0]
                    if most >= 0:
                        open_gpus.remove(most)
                        reserved[ticket] = (most,)
                        if not easy:
                            continue
                    reserving, seen = False, self._seen_upto(visited)
                continue
            taken = self._fit_general(demand, open_gpus, take=True)
            if taken is not None:
                grants.append(_grant((ticket, taken, self._units_of(demand, taken))))
                continue
            if seen is not None and easy:
                if demand.whole or demand.count > 1:
                    failed_count = min(failed_count, demand.count)
                else:
                    failed_units = min(failed_units, demand.units)
            if reserving:
                chosen = kept.get(ticket)
                if chosen is not None and all(gpu in open_gpus for gpu in chosen):
                    for gpu in chosen:
                        open_gpus.remove(gpu)
                else:
                    chosen = self._reserve_general(demand, open_gpus)
                if chosen is not None:
                    reserved[ticket] = chosen
                    if not self._easy:
                        continue
                reserving, seen = False, self._seen_upto(visited)
        self._open, self._reserving = open_gpus, reserving
        for grant in grants:
            done = self._queue.pop(grant.ticket)
            self._index_of(done).remove(self._key_of(done))
        return grants

    def restore(self, gpus: tuple[int, ...], units: int) -> Grant:
        """Re-create a grant that was held before a restart: ``units`` on each of ``gpus``.

        The host server calls this while its clients re-declare their leases, before it
        queues anything, so no reservation or queue walk is involved. Raises ValueError,
        changing nothing, if requests wait, ``gpus`` is empty, repeats or names an unknown
        GPU, or any of them has fewer than ``units`` free.
        """
        if self._queue:
            raise ValueError(f"cannot restore a grant while {len(self._queue)} requests wait")
        if not gpus or len(set(gpus)) != len(gpus):
            raise ValueError(f"gpus to restore must be distinct and non-empty, got {gpus!r}")
        for gpu in gpus:
            self._check_gpu(gpu)
        self._check_units(units)
        for gpu in gpus:
            if self._free[gpu] < units:
                raise ValueError(
                    f"cannot restore {units} units on GPU {gpu}: only {self._free[gpu]} free"
                )
        for gpu in gpus:
            self._free[gpu] -= units
        return Grant(next(self._tickets), tuple(gpus), units)
