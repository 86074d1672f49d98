"""The GPU scheduling core: a pure, synchronous state machine (no I/O, no clock, no threads).

Every front (asyncio, blocking threads, the virtual-time simulator, the host server) drives
this one class and turns the grants it returns into woken waiters. Time enters only as the
``now`` argument of each input, from the caller's clock.

GPUs may differ in size: each has its own total of units (``Scheduler.totals``). Rules 1-2
hold under both policies:

1. A demand needs ``count`` GPUs, each with at least ``units`` free. A fractional demand is
   ``count == 1``; a whole-GPU demand (``count > 1``, or ``whole=True``) needs ``count`` GPUs
   that are completely free, whatever their size. A *relative* demand (``relative=True``,
   ``count == 1``) is a share of whichever GPU it lands on: ``units`` out of
   ``UNITS_PER_GPU``, so on GPU ``g`` it needs ``max(1, ceil(units * totals[g] /
   UNITS_PER_GPU))`` units (on GPUs of one size it is the equal absolute demand). A demand
   that can never fit (more units than the largest GPU, more whole GPUs than there are) is
   refused with ValueError.
2. Placement is best fit: a fractional demand takes the fitting GPU with the least left free
   after the grant (free minus its need there; for an absolute demand, the fewest free
   units), a whole-GPU demand the completely free GPUs with the smallest totals; ties to the
   lowest index (on GPUs of one size: the lowest-indexed free GPUs).

``easy`` (the default): EASY backfilling, with hold times learned from what the core sees.

3e. Waiters form one FIFO queue; its first waiter is the head, and only the head reserves:
    the GPUs expected to have room for it soonest (ties: the most free, then the lowest
    index, as in rule 3; for a relative head, the most free beyond its need there). Its
    shadow is when that is expected. It keeps those GPUs until it is granted or cancelled,
    except that once its shadow has passed it may move, once, to GPUs now expected to have
    room strictly sooner.
4e. Every other waiter, in queue order, and every new arrival may be granted at once on the
    GPUs the head does not reserve, and on the head's GPUs only before its shadow, and only
    if it surely cannot delay the head: its enforced ``limit`` ends by the shadow, or (for a
    fractional head, and a fractional demand) it leaves the head's need there free at the
    shadow, counting as freed by then only what grants whose limits end by then hold.
    Estimates (rule 7e, hints included) let nothing onto the head's GPUs: they are not
    enforced, so a request that holds longer than expected would delay the head without
    bound, and one that lies about its hold would gain by it (issue 23). Under
    ``backfill="estimates"`` (for a caller whose requests are one program's, which trusts
    its own estimates) an expected hold that ends by the shadow counts as a limit does, and
    the slack counts the grants expected to end by then. A new arrival never passes an
    earlier waiter of its own demand (size, owner, priority and limit).
5e. The head is granted as soon as it fits anywhere (best fit, rule 2); every release or
    cancellation grants what now fits from the front, then backfills (rule 4e). The
    backfill offers one waiter per demand; on GPUs of one size and in FIFO order, the
    fractional demands without a limit are found through an index of their sizes (only
    those that fit are visited), so its cost does not grow with the distinct sizes waiting.
6e. So the head's wait is bounded by what the core controls: it starts once the grants running
    on its GPUs when it became head have ended; every grant placed there since has ended by
    the shadow, its limit being enforced by the caller. (After a move, the same from the
    move.) Under ``backfill="estimates"``, by the shadow if the estimates hold.
7e. Estimates choose only the head's GPUs and its shadow (rule 3e). A request's expected hold
    is its ``expected`` hint, else the smoothed mean (weight ``SMOOTHING``) of its demand's
    past hold times, else the mean over all demands; none is known before the first release.
    A running grant is expected to end at its start plus that; one past it (or with none) is
    expected to run as long again as it has, and at least the mean over all; one with a
    limit ends by its start plus the limit at the latest. In rule 3e, GPUs expected within
    ``GRAIN`` times the head's own expected hold of the soonest are a tie.

``reserve-all`` (the policy hwpool started from; rules 3-5 replace 3e-7e):

3. Walking the queue in order, each waiter that cannot be granted reserves, among the GPUs
   no earlier waiter reserves, the ``count`` most free ones: for a fractional demand the GPU
   with the most free units beyond its need there (free minus need: for an absolute demand,
   the most free units) among those whose total could ever hold it, for a whole-GPU demand
   the GPUs with the fewest units in use (on GPUs of one size both are "most free"); ties to
   the lowest index. The first waiter that cannot get its full set stops all
   reservations behind it.
4. Any request may be granted at once on GPUs that no earlier waiter reserves (backfill).
5. Every release or cancellation walks the queue again, granting what now fits. The walk stops
   as soon as no unreserved GPU can serve anything further back, which it knows from a sorted
   index of the demands still waiting, without scanning them. On GPUs of one size this walk
   is the fast path; GPUs of different sizes take a plainer walk with the same rules.

Owners, shares and priorities (both policies; issue 23). "Queue order" in the rules above
is this order, taken at the ``now`` of each call:

8. Every demand has an owner (any hashable; default None) and a priority (an int; default
   0). An owner's *usage* is the GPU-seconds of its grants, finished and running up to
   ``now`` (``u`` units on a GPU of ``total`` count ``u / total`` GPUs), decayed
   exponentially with the scheduler's ``half_life`` (default an hour): the usage of Slurm's
   classic fair-share factor (priority/multifactor plugin, ``PriorityDecayHalfLife``). Its
   *share* comes from ``shares`` (default 1). Usage is kept in O(1) per grant and release.
   Under ``easy`` it is counted from the first demand that names an owner or a priority
   (until then everything is one owner's, whose usage orders nothing, and a grant costs no
   bookkeeping); grants running then count from their start, earlier ones not at all.
9. Queue order: owners by usage / share, least first (ties: the owner whose earliest waiter
   came first), and each owner's waiters together in its own order (rule 10): Slurm's order
   by fair-share factor, ``2 ** (-usage / share)``, which ranks owners alike. Usage changes
   with time, so the order is taken afresh at each call, in O(owners log owners): a box has
   tens of owners. Work-conserving: the order only ranks waiters; an owner alone gets every
   GPU, and backfill (rules 4, 4e) is unchanged. Owners that keep work queued get GPU-time
   in proportion to their shares, within about ``k * g * T / (2 * r)`` (``k = ln 2 /
   half_life``; ``g``, ``T``: a grant's GPUs and hold; ``r``: the owner's GPUs on average):
   an owner is served at the low point of its usage, which a grant raises only as it runs.
   ``bench/bench_fairness.py`` measures it (1-2% at the default half-life).
10. Within an owner: higher priority first, FIFO within a priority. A priority never passes
   another owner's waiter. With one owner at one priority (the default) the order is FIFO
   and every decision is exactly what it was before owners.
10e. Under ``easy`` the head is the first waiter in queue order *when a head is chosen*, and
   stays head (rules 3e-6e) until granted or cancelled, with one exception: while no other
   head has yielded, a head yields, once in its wait, to the first waiter in queue order if
   that waiter's owner has strictly less usage per share (a user whose flood holds the head
   does not make a newcomer wait for it). The yielded waiter becomes head again as soon as
   the one it yielded to is granted or cancelled, so every head's wait stays bounded: its
   own rule-6e bound plus one other head's.
10r. Under ``reserve-all`` a new arrival backfills (rule 4) and reserves at the tail, as
   before; its owner's place in the order counts from the next walk (release or cancel).

Limits per owner (both policies; issue 23), set by whoever builds the scheduler:

11. An owner may have :class:`~hwpool._core._limits.OwnerLimits` (``limits``, and
   ``default_limits`` for owners not named): ``gpus``, the most GPUs it holds at once (a
   request counts the most GPUs it could hold wherever it lands: ``count`` whole GPUs, or
   ``u`` units over the smallest GPU that could hold them, as :meth:`Scheduler.running`
   counts); ``units``, the most units it holds at once, summed over GPUs (whole GPUs: the
   largest it could get); ``running``, the most grants it holds at once; ``queued``, the
   most requests it has waiting. A waiter that would take its owner past ``gpus``,
   ``units`` or ``running`` is *held*: it stays in its place in the queue order but is
   never head, never reserves and is never granted or backfilled, so the head (rules 3e,
   10e) is the first waiter in queue order that is not held, and under ``reserve-all``
   the walk passes held waiters by. A waiter that reserves (the head, or a reserving
   waiter under ``reserve-all``) keeps its room in its owner's limits: a later waiter of
   that owner counts it as held already. Every release or cancel walks the queue again
   (rules 5, 5e), so a held waiter is considered as soon as its owner is back under the
   limit; once nothing new comes, every waiter is granted. Refused with
   :class:`~hwpool._core._limits.LimitExceeded` (a ValueError naming the owner, the limit
   and the value), changing nothing: a request bigger than its owner's ``gpus`` or
   ``units`` (it could never run); one that would wait while its owner already has
   ``queued`` waiting; and under ``mode="refuse"`` one that would take what its owner
   holds *and has waiting* past ``gpus``, ``units`` or ``running`` (so such an owner has
   no held waiter). Without limits nothing of this costs a decision or changes one; with
   limits, GPUs of one size take the plain walk of GPUs of different sizes (the same
   rules), and under ``easy`` the head is found among held waiters per demand, not per
   waiter.

Groups of GPUs (both policies; issue 25), set by whoever builds the scheduler:

12. ``groups`` gives each GPU a group (any hashable; GPUs of one machine of a cluster, say,
   where a process sees the GPUs of its own machine only). A demand of ``count > 1`` whole
   GPUs is then placed, and reserves, within one group, and is refused with ValueError if
   no group has ``count`` GPUs. Placement (rule 2): among the groups with ``count``
   completely free GPUs, it takes rule 2's choice within the group whose choice has the
   smallest totals, then the group with the fewest completely free GPUs (best fit: a group
   left whole serves a wider demand), ties to the lowest index. Reservation under ``easy``
   (rule 3e): within the group whose ``count``-th GPU is expected to have room soonest;
   groups within ``GRAIN`` times the head's expected hold of that are a tie, broken by the
   most units free on the GPUs it would reserve, then the lowest index; within the group as
   rule 3e says. So rules 4e-6e hold as they are: nothing new goes onto a multi-GPU head's
   GPUs unless its limit ends by the shadow, and its wait is bounded by the grants running
   there, all on one group. Under ``reserve-all`` (rule 3) a multi-GPU waiter reserves
   within the group whose ``count`` GPUs with the fewest units in use (among those no
   earlier waiter reserves) have the fewest in all, ties to the lowest index; the first
   that finds no such group stops reservations. Single-GPU demands ignore groups. With one
   group (the default) every decision is exactly what it is without groups; with more, the
   core takes the plain walk of GPUs of different sizes (the same rules).

Shared memory (both policies; issue 36), set by whoever builds the scheduler:

13. ``memory_groups`` gives each GPU a memory group (any hashable; None: a memory of its own).
   GPUs of one group draw on one capacity (MIG compute instances of one GPU instance, each
   a CUDA device of its own that may allocate all of the instance's memory): the units
   granted on all of them together never exceed the group's capacity (their common total),
   and each GPU's free units are the least of its own and its group's
   (:mod:`~hwpool._core._shared`). A whole-GPU grant of one of them holds the whole group.
   The head's GPUs reserve their groups: under ``easy`` nothing goes onto another GPU of a
   head's group but what may go onto the head's own GPUs by an enforced limit (rule 4e,
   not by slack); under ``reserve-all`` a reservation closes the other GPUs of its group.
   Hold-time estimates (rule 7e) count the grants on a GPU itself, not on its group: the
   shadow may be early (the head then waits on, and may move once). With a memory group
   the core takes the plain walk of GPUs of different sizes (the same rules).

Invariants after every call: per GPU ``0 <= free <= total``; a ticket is waiting, granted or
gone, never two; reservations are disjoint and held only by waiters; with groups, every
grant and reservation of more than one GPU lies within one group; with memory groups, the
units held on a group's GPUs together are at most its capacity.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._check import check_int, check_real, check_timeout
from ._capacity import UNITS_PER_GPU
from ._durations import Durations
from ._fairshare import DEFAULT_HALF_LIFE, OwnerQueue, Usage, check_half_life, check_shares
from ._limits import EPSILON, LimitExceeded, LimitHold, OwnerLimits, check_limits
from ._policies import BACKFILLS, POLICIES
from ._shared import SharedFree, check_memory_groups
from ._sizes import SizeIndex

__all__ = ["BACKFILLS", "POLICIES", "Demand", "Grant", "Head", "Scheduler", "Waiter"]

GRAIN = 2.0
"""Rule 3e: GPUs expected to have room within this many of the head's expected holds of the
soonest are a tie (estimates are no finer), broken by the most free."""


@dataclass(frozen=True, slots=True)
class Demand:
    """What one request needs: ``count`` GPUs with ``units`` free on each.

    ``count > 1`` always means whole GPUs; ``whole=True`` asks for one (or ``count``) whole
    GPUs of any size, where ``units`` is not used for fitting. ``relative=True`` (with
    ``count == 1``) makes ``units`` a share of one GPU in ``UNITS_PER_GPU`` units, whatever
    its size: on GPUs of different sizes its need differs per GPU (rule 1). ``owner`` (any
    hashable; default None, one owner for all) and ``priority`` (an int, higher first; default
    0) place it in the queue (rules 8-10); they never change where it fits. ``limit``
    (seconds, finite and > 0; default None) is a hold time the caller *enforces*: it ends the
    work or takes the grant back once it has held that long, so the core may count on it
    (rules 4e and 6e); a demand without one is trusted to end by no time at all.
    """

    count: int
    units: int
    whole: bool = False
    relative: bool = False
    owner: Hashable = None
    priority: int = 0
    limit: float | None = None


class Grant(NamedTuple):
    """A request that has been granted: ``units`` taken on each GPU of ``gpus``.

    A whole-GPU grant holds each GPU's total; where those differ, ``units`` is 0 and
    :meth:`Scheduler.held` gives what each GPU holds. A relative demand's grant holds the
    units it took on its one GPU.
    """

    ticket: int
    gpus: tuple[int, ...]
    units: int


_UNSEEN = Demand(0, 0)
"""No demand a caller passes (the scheduler's remembered demand before the first)."""

# Grant((ticket, gpus, units)) without the Python frame of NamedTuple.__new__ (the hot path).
_grant = functools.partial(tuple.__new__, Grant)


class Head(NamedTuple):
    """The head of the queue under ``easy``: the GPUs it reserves and its shadow, the time
    (on the caller's clock) it is expected to fit there; ``since``: when it became head;
    ``moved``: whether it has used its one move (rule 3e)."""

    ticket: int
    gpus: tuple[int, ...]
    shadow: float
    since: float
    moved: bool = False


def _class_of(demand: Demand) -> tuple[int, int, bool] | tuple[int, int, bool, bool]:
    """The key hold times are learned under: a tuple hashes faster than a Demand. A relative
    demand's key is longer, so it never shares a class with an absolute demand of its units."""
    if demand.relative:
        return (demand.count, demand.units, demand.whole, True)
    return (demand.count, demand.units, demand.whole)


def _share(units: int, total: int) -> int:
    """Units that ``units`` out of ``UNITS_PER_GPU`` are of a GPU of ``total``, rounded up
    (at least one): exact integer arithmetic."""
    return max(1, -(-units * total // UNITS_PER_GPU))


def _first(entry: tuple[int, Demand, float | None]) -> int:
    return entry[0]


def _check_limit(limit: object) -> None:
    """TypeError/ValueError naming ``limit`` unless it is a finite real number > 0."""
    number = check_real("limit", limit)
    if not 0.0 < number < math.inf:
        raise ValueError(f"limit must be a finite number of seconds > 0, got {limit!r}")


def _check_rebuilt_ticket(ticket: object) -> int:
    if type(ticket) is not int:
        raise TypeError(f"ticket must be an int, got {ticket!r}")
    return ticket


def _check_groups(groups: object, num_gpus: int) -> tuple[tuple[int, ...], ...] | None:
    """The GPUs of each group (rule 12), groups in the order of their lowest GPU; None for
    no groups or one group (where no decision changes). TypeError or ValueError naming
    ``groups`` unless it is a sequence of ``num_gpus`` hashables."""
    if groups is None:
        return None
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise TypeError(
            f"groups must be a sequence with each GPU's group, got {groups!r} "
            f"({type(groups).__name__})"
        )
    if len(groups) != num_gpus:
        raise ValueError(
            f"groups must name one group per GPU ({num_gpus}), got {len(groups)}: {groups!r}"
        )
    members: dict[Hashable, list[int]] = {}
    for gpu, group in enumerate(groups):
        try:
            members.setdefault(group, []).append(gpu)
        except TypeError:
            raise TypeError(
                f"groups[{gpu}] must be hashable, got {group!r} ({type(group).__name__})"
            ) from None
    if len(members) == 1:
        return None
    return tuple(tuple(gpus) for gpus in members.values())


class Waiter(NamedTuple):
    """A waiting request as the core sees it: its ticket, demand and current reservation,
    and ``held``: why its owner's limit holds it (rule 11), or None."""

    ticket: int
    demand: Demand
    reserved: tuple[int, ...]
    held: LimitHold | None = None


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
    cancel raises ValueError or KeyError and leaves the state unchanged. No call is atomic
    under an exception raised inside it (KeyboardInterrupt from a signal handler, MemoryError):
    a front that sees one rebuilds the core from its own books with :meth:`rebuild`.
    """

    def __init__(
        self,
        gpus: int | Sequence[int],
        units_per_gpu: int | None = None,
        *,
        policy: str = "easy",
        shares: Mapping[Hashable, float] | None = None,
        half_life: float = DEFAULT_HALF_LIFE,
        backfill: str = "limits",
        limits: Mapping[Hashable, OwnerLimits] | None = None,
        default_limits: OwnerLimits | None = None,
        groups: Sequence[Hashable] | None = None,
        memory_groups: Sequence[Hashable | None] | None = None,
    ) -> None:
        """``gpus``: a count of GPUs of ``units_per_gpu`` units each (default a whole GPU's
        ``UNITS_PER_GPU``), or a sequence giving each GPU's total in units (any positive
        ints; then ``units_per_gpu`` is not given and reads as the largest total).
        ``policy``: one of :data:`POLICIES` (see the module docstring). ``shares``: owner ->
        share (a finite number > 0; owners not named have 1); ``half_life``: seconds of the
        caller's clock over which usage counts half (rule 8; default
        :data:`~hwpool._core._fairshare.DEFAULT_HALF_LIFE`, an hour). ``backfill``: one of
        :data:`BACKFILLS`, what may go onto the ``easy`` head's GPUs (rule 4e). ``limits``:
        owner -> :class:`~hwpool._core._limits.OwnerLimits`, and ``default_limits`` for every
        owner not named there (rule 11; default: none). ``groups``: each GPU's group (a
        sequence of hashables, one per GPU; default: one group), within which a multi-GPU
        demand is placed and reserves (rule 12). ``memory_groups``: each GPU's memory group
        (None: a memory of its own; default: every GPU its own), whose GPUs have equal
        totals and draw on that one capacity (rule 13).
        """
        checked_limits, checked_default = check_limits(limits, default_limits)
        checked_shares = check_shares(shares)
        checked_half_life = check_half_life(half_life)
        if not isinstance(policy, str):
            raise TypeError(f"policy must be a str, got {policy!r} ({type(policy).__name__})")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
        if not isinstance(backfill, str) or backfill not in BACKFILLS:
            raise ValueError(f"backfill must be one of {', '.join(BACKFILLS)}; got {backfill!r}")
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
        self._smallest = min(totals)
        self._totals = totals
        self.policy = policy
        self.backfill = backfill
        self._easy = policy == "easy"
        self._by_estimates = backfill == "estimates"
        self._uniform = len(set(totals)) == 1
        # Rule 11: the limits per owner, and whether any is set.
        self._limits = checked_limits
        self._default_limits = checked_default
        self._limited = any(lim.active for lim in checked_limits.values()) or (
            checked_default is not None and checked_default.active
        )
        # Rule 12: the GPUs of each group (None: one group, no rule to keep).
        self._groups = _check_groups(groups, self.num_gpus)
        # Rule 13: the GPUs of each memory group of two or more (None: every GPU its own).
        self._shared = check_memory_groups(memory_groups, totals)
        self._sibling_of = self._siblings(self._shared)
        # The fast path (GPUs of one size, no limits, one group); else the plain walk.
        self._fast = (
            self._uniform and not self._limited and self._groups is None and self._shared is None
        )
        self._tickets = itertools.count(1)
        # Under easy: the clock, and what was learned (with the grants running).
        self._now = 0.0
        # Relative demands on GPUs of different sizes: share in units -> need on each GPU.
        self._relative_needs: dict[int, list[int]] = {}
        # The demand last admitted, as given and as admitted (see _admit_anew).
        self._admitted: tuple[Demand, Demand] = (_UNSEEN, _UNSEEN)
        self._withheld = [0] * self.num_gpus  # units held by no one: see withhold()
        self._init_owners(totals, checked_shares, checked_half_life)
        self._start_over()

    def _start_over(self) -> None:
        """Set what :meth:`rebuild` makes afresh: every GPU free, nobody waiting."""
        shared = self._shared
        self._free = list(self._totals) if shared is None else SharedFree(self._totals, shared)
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
        # Under easy: the head, the waiters per demand (FIFO within each; a demand includes
        # its owner, priority and limit), and the hints of those that gave one.
        self._head: Head | None = None
        self._open_of: Head | None = None  # the head self._open_easy was made for
        self._open_easy: list[int] = []
        self._classes: dict[Demand, OrderedDict[int, None]] = {}
        self._hints: dict[int, float] = {}
        # The classes that fit by their units alone (see _by_size), by size with their
        # first waiter; the other classes by demand.
        self._sizes = SizeIndex(self.units_per_gpu)
        self._unsized: dict[Demand, OrderedDict[int, None]] = {}
        self._reset_owner_queues()

    def _init_owners(
        self, totals: list[int], shares: dict[Hashable, float], half_life: float
    ) -> None:
        """The state of rules 8-10e: usage per owner, each owner's waiters, and whether the
        order differs from FIFO (more than one owner, or more than one priority, waits)."""
        self._usage = Usage(totals, shares, half_life)
        # Under easy each grant's one record is its hold-time run, which reports to usage;
        # and usage is counted only once some demand names an owner (see _count_usage).
        self._durations = Durations(self.num_gpus, self._usage)
        self._counting = not self._easy or self._limited  # limits read what owners hold
        self._queued = 0  # counts every change to the queue (see _ranked)
        self._reset_owner_queues()

    def _reset_owner_queues(self) -> None:
        """Nobody waits: no owner queues, FIFO order, no yielded head (rules 9-10e). Usage
        is kept; call this wherever the queue is emptied wholesale."""
        self._owner_queues: dict[Hashable, OwnerQueue] = {}
        self._fair = False
        # The owners ranked (rule 9) at (now, self._queued): usage at one ``now`` does not
        # change with grants or releases made at it, so only time and the queue matter.
        self._queued += 1
        self._ranked_at: tuple[float, int] = (-math.inf, -1)
        self._ranked_owners: list[tuple[Hashable, OwnerQueue]] = []
        # Under easy (rule 10e): the head that yielded its place, until it is head again,
        # and the waiters that have yielded once (they never yield again).
        self._resume: int | None = None
        self._yielded: set[int] = set()
        # Rule 11 (only with limits): per owner, its waiters and the GPUs and units they ask
        # at most.
        self._waiting_of: dict[Hashable, list[float]] = {}

    # ----------------------------------------------------------------- queries
    @property
    def free(self) -> tuple[int, ...]:
        """Free units per GPU."""
        return tuple(self._free)

    @property
    def totals(self) -> tuple[int, ...]:
        """Each GPU's total units."""
        return tuple(self._totals)

    @property
    def groups(self) -> tuple[tuple[int, ...], ...]:
        """The GPUs of each group (rule 12); one group of every GPU unless ``groups`` split
        them."""
        return self._groups if self._groups is not None else (tuple(range(self.num_gpus)),)

    @property
    def memory_groups(self) -> tuple[tuple[int, ...], ...]:
        """The GPUs of each memory group of two or more GPUs (rule 13); empty if none."""
        return self._shared or ()

    def memory_held(self) -> tuple[tuple[tuple[int, ...], int, int], ...]:
        """Per memory group (rule 13): its GPUs, its capacity and the units held on them."""
        free = self._free
        return free.group_held() if isinstance(free, SharedFree) else ()

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
        """The waiting requests in queue order (rule 9, as of the latest ``now``), with their
        current reservations."""
        reserved = self.reservations() if self._easy else self._reserved
        for ticket, demand in list(self._in_order()):
            mine = reserved.get(ticket, ())
            held = self._hold(ticket, demand) if self._limited and not mine else None
            yield Waiter(ticket, demand, mine, held)

    def held_by_limit(self, ticket: int) -> LimitHold | None:
        """Why waiter ``ticket`` is held by its owner's limit (rule 11), or None if it is
        not; KeyError if ``ticket`` is not waiting."""
        demand = self._queue[ticket]
        if not self._limited or ticket in self.reservations():
            return None
        return self._hold(ticket, demand)

    def limits(self, owner: Hashable) -> OwnerLimits | None:
        """``owner``'s limits (rule 11), or None if it has none."""
        return self._limits_of(owner)

    def usage(self, owner: Hashable, now: float | None = None) -> float:
        """``owner``'s recent usage in GPU-seconds, decayed with the half-life (rule 8), at
        ``now`` (default, and at the earliest: the latest time given); 0 for an owner never
        granted."""
        at = max(self._now, self._time(now))
        self._count_usage()
        return self._usage.usage(owner, at)

    def running(self, owner: Hashable) -> float:
        """GPUs ``owner`` holds now (a fraction counts its share of its GPU)."""
        self._count_usage()
        return self._usage.running(owner)

    def share(self, owner: Hashable) -> float:
        """``owner``'s share (1 unless the scheduler's ``shares`` name it)."""
        return self._usage.share(owner)

    @property
    def half_life(self) -> float:
        """Seconds over which usage counts half (rule 8)."""
        return self._usage.half_life

    def reservations(self) -> dict[int, tuple[int, ...]]:
        """Reserved GPUs per waiting ticket (waiters that reserve nothing are absent)."""
        if self._easy:
            return {} if self._head is None else {self._head.ticket: self._head.gpus}
        return dict(self._reserved)

    @property
    def head(self) -> Head | None:
        """Under ``easy``, the head of the queue with its GPUs and shadow; else None."""
        return self._head

    @property
    def now(self) -> float:
        """The latest time any input gave (the clock never goes back); 0 before any."""
        return self._now

    def expected(self, demand: Demand) -> float | None:
        """The hold time in seconds the core would assume for ``demand`` without a hint (the
        smoothed mean of its demand's, else of all, hold times), or None before any is known."""
        return self._durations.guess(_class_of(self._admit(demand)))

    # ----------------------------------------------------------------- inputs
    def grant_now(
        self, demand: Demand, *, now: float | None = None, expected: float | None = None
    ) -> Grant | None:
        """Grant ``demand`` where a new arrival would be granted at once, or return None.

        Never queues and never jumps the queue: only capacity the policy lets a new arrival
        take (rule 4, or 4e). ``now``: the caller's clock, in seconds; ``expected``: how long
        the caller expects to hold it (see :meth:`submit`). Raises ValueError (or TypeError),
        changing nothing, for a demand that could never fit or a bad ``now`` or ``expected``,
        and :class:`~hwpool._core._limits.LimitExceeded` where its owner's limits refuse it
        (rule 11; a request they would hold is not granted: None).
        """
        admitted = self._admitted
        demand = admitted[1] if admitted[0] is demand else self._admit_anew(demand)
        clock = now if type(now) is float and now - now == 0.0 else self._time(now)
        hint = None if expected is None else check_timeout(expected, "expected")
        if self._limited:
            self._refuse_beyond(demand, max(self._now, clock), hint, queues=False)
        if clock > self._now:  # noqa: PLR1730 (max() is a call, on every grant and release)
            self._now = clock
        if self._easy:
            at = self._now
            if self._queue or not self._fast or hint is not None:
                gpus = self._place_new_easy(demand, hint, at)
                if gpus is None:
                    return None
                return self._granted(next(self._tickets), demand, gpus, at, hint)
            units, free = demand.units, self._free  # nobody waits: the fast path, inline
            least = min(free)
            if demand.count == 1 and least >= units:  # every GPU fits: _take_new's best fit
                best = free.index(least)
                free[best] -= units
                gpus = (best,)
            else:
                gpus = self._take_new(demand)
                if gpus is None:
                    return None
            ticket = next(self._tickets)
            key = (demand.count, units, False)  # _class_of(demand), inline
            held = dict.fromkeys(gpus, units)
            account = self._usage.hold(demand.owner, held, at) if self._counting else None
            self._durations.start(ticket, key, held, at, None, account, demand.limit)
            return _grant((ticket, gpus, units))
        gpus = self._take_new(demand)
        if gpus is None:
            return None
        return self._accounted(
            _grant((next(self._tickets), gpus, self._units_of(demand, gpus))), demand.owner
        )

    def submit(
        self, demand: Demand, *, now: float | None = None, expected: float | None = None
    ) -> tuple[int, Grant | None]:
        """Add a request; return its ticket and its grant if it was granted at once.

        A request not granted at once waits in the queue (and may reserve GPUs) until a later
        ``release`` or ``cancel`` grants it or it is cancelled. ``now`` is the caller's clock
        in seconds (any origin, never going back; omitted: the last one given), from which
        ``easy`` learns hold times; ``expected`` (seconds, optional) is how long the caller
        expects to hold the grant, used instead of what was learned. Raises ValueError (or
        TypeError), changing nothing, for a demand that could never fit or a bad ``now`` or
        ``expected``, and :class:`~hwpool._core._limits.LimitExceeded` (a ValueError) where its
        owner's limits refuse it (rule 11).
        """
        admitted = self._admitted
        demand = admitted[1] if admitted[0] is demand else self._admit_anew(demand)
        clock = now if type(now) is float and now - now == 0.0 else self._time(now)
        if expected is not None:
            expected = check_timeout(expected, "expected")
        if self._limited:
            self._refuse_beyond(demand, max(self._now, clock), expected)
        if self._easy:
            return self._submit_easy(demand, self._commit(clock), expected)
        self._commit(clock)
        if not self._fast:
            return self._submit_general(demand)
        ticket = next(self._tickets)
        gpus = self._take_new(demand)
        if gpus is not None:
            return ticket, self._accounted(_grant((ticket, gpus, demand.units)), demand.owner)
        if not self._queue:
            self._tail.reset()
        self._enqueue(ticket, demand)
        self._index_of(demand).add(self._key_of(demand))
        reserved = self._tail.reserve(demand.count)
        if reserved is not None:
            self._reserved[ticket] = reserved
        return ticket, None

    def release(
        self, gpu: int, units: int, *, ticket: int | None = None, now: float | None = None
    ) -> list[Grant]:
        """Give back ``units`` on ``gpu``; return the waiters granted as a result.

        ``ticket``: the grant they belong to, so that ``easy`` learns its hold time (without
        it the core guesses which grant ended, and learns nothing); ``now``: as in
        :meth:`submit`.
        """
        free = self._free
        if not (
            type(gpu) is int
            and 0 <= gpu < self.num_gpus
            and type(units) is int
            and 0 < units <= self._totals[gpu] - free[gpu]
            and self._shared is None
        ):  # the checks again, slowly, for the error message (and NumPy ints made ints)
            gpu = self._check_gpu(gpu)
            units = self._check_release(gpu, units)
        clock = now if type(now) is float and now - now == 0.0 else self._time(now)
        if ticket is not None and type(ticket) is not int:
            self._check_ticket(ticket)
        self._now = max(self._now, clock)
        free[gpu] += units
        at = self._now
        if not self._easy:
            self._usage.finish(ticket, gpu, units, at)
            return self._walk() if self._queue else []
        self._durations.finish(ticket, gpu, units, at)
        return self._walk_easy(at) if self._queue else []

    def release_granted(self, grant: Grant, now: float | None = None) -> list[Grant]:
        """Give back all of ``grant``, a grant of this core that its caller's own books show
        held (and hand back once): :meth:`release` of each GPU without checking the
        arguments against the state, for a caller that keeps such books (the in-process
        backend, on every release). ``now``: as in :meth:`release`; the waiters granted as a
        result are returned."""
        gpus, units = grant.gpus, grant.units
        if len(gpus) != 1 or not units:  # several GPUs, or whole ones of mixed sizes
            return self.release_many(self.held(grant), ticket=grant.ticket, now=now)
        clock = now if type(now) is float and now - now == 0.0 else self._time(now)
        if clock > self._now:  # noqa: PLR1730 (max() is a call, on every grant and release)
            self._now = clock
        at, gpu = self._now, gpus[0]
        self._free[gpu] += units
        if self._easy:
            self._durations.finish(grant.ticket, gpu, units, at)
            return self._walk_easy(at) if self._queue else []
        self._usage.finish(grant.ticket, gpu, units, at)
        return self._walk() if self._queue else []

    def release_many(
        self,
        releases: Iterable[tuple[int, int]],
        *,
        ticket: int | None = None,
        now: float | None = None,
    ) -> list[Grant]:
        """Give back several ``(gpu, units)`` at once (all or nothing), then walk the queue
        once; ``ticket`` and ``now`` as in :meth:`release`."""
        pending: dict[int, int] = {}
        for raw_gpu, raw_units in releases:
            gpu = self._check_gpu(raw_gpu)
            units = self._check_units(raw_units)
            pending[gpu] = pending.get(gpu, 0) + units
        for gpu, units in pending.items():
            self._check_release(gpu, units)
        clock = self._time(now)
        self._check_ticket(ticket)
        at = self._commit(clock)
        for gpu, units in pending.items():
            self._free[gpu] += units
            if self._easy:
                self._durations.finish(ticket, gpu, units, at)
            else:
                self._usage.finish(ticket, gpu, units, at)
        if not self._queue:
            return []
        return self._walk_easy(at) if self._easy else self._walk()

    def cancel(self, ticket: int, *, now: float | None = None) -> list[Grant]:
        """Withdraw a waiting request; return the waiters granted as a result.

        Raises KeyError if ``ticket`` is not waiting (it was granted, or never existed).
        """
        clock = self._time(now)
        if ticket not in self._queue:
            raise KeyError(ticket)
        at = self._commit(clock)
        if self._easy:
            self._dequeue(ticket)
            if self._head is not None and self._head.ticket == ticket:
                self._head = None
            return self._walk_easy(at)
        demand = self._unqueue(ticket)
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
        free = self._free
        held = free.held[gpu] if isinstance(free, SharedFree) else self._totals[gpu] - free[gpu]
        if number > held:
            raise ValueError(f"cannot release {number} units on GPU {gpu}: only {held} held")
        return number

    def _admit_anew(self, demand: Demand) -> Demand:
        """:meth:`_admit`, remembered for the next call with this very demand: a front passes
        the same (frozen) Demand object for the same request, and admitting it depends on
        nothing that changes (its one side effect, counting usage from then on, is done
        once for all)."""
        admitted = self._admit(demand)
        self._admitted = (demand, admitted)  # one store: never half updated
        return admitted

    def _admit(self, demand: Demand) -> Demand:
        """``demand`` as the walk takes it, or ValueError if it could never fit.

        On GPUs of one size a whole-GPU demand is ``units_per_gpu`` on each and a relative
        demand its share of that, so the fast path sees nothing new; on GPUs of different
        sizes both keep their mark. ValueError for a relative demand of more than one GPU,
        of whole GPUs, or of a share outside 1..UNITS_PER_GPU units.
        """
        count, units = demand.count, demand.units
        if demand.owner is not None or demand.priority.__class__ is not int or demand.priority:
            self._check_owner(demand)
            self._count_usage()
        if demand.limit is not None:
            _check_limit(demand.limit)
        if demand.relative:
            return self._admit_relative(demand)
        if count > 1 or demand.whole:
            if not 1 <= count <= self.num_gpus:
                raise ValueError(
                    f"count must be between 1 and num_gpus={self.num_gpus} (whole GPUs), "
                    f"got {count}"
                )
            if self._groups is not None and count > 1:
                self._check_group_count(count)
            if self._shared is not None and count > 1:
                self._check_memory_count(count)
            if self._uniform:
                if units != self.units_per_gpu or demand.whole:
                    return Demand(
                        count,
                        self.units_per_gpu,
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
        if not 1 <= units <= self.units_per_gpu:
            raise ValueError(
                f"units must be between 1 and {self.units_per_gpu} (the largest GPU), got {units}"
            )
        return demand

    def _check_group_count(self, count: int) -> None:
        """ValueError unless some group has ``count`` GPUs (rule 12)."""
        largest = max(len(gpus) for gpus in self._groups or ())
        if count > largest:
            raise ValueError(
                f"count must be at most {largest} (whole GPUs within one group: the largest "
                f"group has {largest}), got {count}"
            )

    def _check_memory_count(self, count: int) -> None:
        """ValueError unless there are ``count`` GPUs that share no memory (rule 13)."""
        distinct = self.num_gpus - sum(len(gpus) - 1 for gpus in self._shared or ())
        if count > distinct:
            raise ValueError(
                f"count must be at most {distinct} (whole GPUs that share no memory: "
                f"{self.num_gpus} GPUs, {distinct} memories), got {count}"
            )

    def _one_per_memory(self, gpus: Iterable[int]) -> list[int]:
        """``gpus`` in their order, less each GPU whose memory group an earlier one has
        (rule 13: whole GPUs of one grant never share a memory)."""
        if not self._sibling_of:
            return list(gpus)
        kept: list[int] = []
        seen: set[int] = set()
        for gpu in gpus:
            if gpu not in seen:
                kept.append(gpu)
                seen.add(gpu)
                seen.update(self._sibling_of.get(gpu, ()))
        return kept

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
        if self._uniform:
            return Demand(
                1,
                _share(units, self.units_per_gpu),
                owner=demand.owner,
                priority=demand.priority,
                limit=demand.limit,
            )
        return demand

    @staticmethod
    def _check_owner(demand: Demand) -> None:
        """TypeError naming the value for an owner that cannot be hashed or a priority that
        is not an int."""
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

    # --------------------------------------------------------- owners (rules 8-10)
    def _enqueue(self, ticket: int, demand: Demand) -> None:
        """Put a waiter at the end of its owner's queue at its priority."""
        self._queue[ticket] = demand
        self._queued += 1
        if self._limited:
            tally = self._waiting_of.setdefault(demand.owner, [0.0, 0.0, 0.0])
            tally[0] += 1
            tally[1] += self._charge(demand)
            tally[2] += self._unit_charge(demand)
        queues = self._owner_queues
        queue = queues.get(demand.owner)
        if queue is None:
            queue = queues[demand.owner] = OwnerQueue()
        queue.add(ticket, demand.priority)
        self._fair = len(queues) > 1 or len(queue.priorities) > 1

    def _unqueue(self, ticket: int) -> Demand:
        """Take a waiter out of the queue and its owner's queue; return its demand."""
        demand = self._queue.pop(ticket)
        self._queued += 1
        if self._limited:
            tally = self._waiting_of[demand.owner]
            tally[0] -= 1
            tally[1] -= self._charge(demand)
            tally[2] -= self._unit_charge(demand)
            if not tally[0]:
                del self._waiting_of[demand.owner]
        queues = self._owner_queues
        queue = queues[demand.owner]
        queue.remove(ticket, demand.priority)
        if not queue.priorities:
            del queues[demand.owner]
        if self._fair:
            self._fair = len(queues) > 1 or any(len(q.priorities) > 1 for q in queues.values())
        return demand

    def _count_usage(self) -> None:
        """Count usage from now on, if not yet (rule 8: under ``easy`` only once a demand
        names an owner or a priority, or usage is asked for: until then all is one owner's,
        whose usage orders nothing, and a grant costs no bookkeeping). The grants running
        then count from their start; those that ended before are not counted."""
        if not self._counting:
            self._counting = True
            self._durations.count_running(self._usage.hold_since, self._now)

    def _accounted(self, grant: Grant, owner: Hashable) -> Grant:
        """``grant`` of ``owner``, counted in its usage from now (rule 8)."""
        self._usage.start(grant.ticket, owner, self.held(grant), self._now)
        return grant

    def _ranked(self) -> list[tuple[Hashable, OwnerQueue]]:
        """The owners with waiters, fairest first (rule 9): least usage per share at the
        latest ``now``, ties to the owner whose earliest waiter came first."""
        if self._ranked_at == (self._now, self._queued):  # nothing that ranks has changed
            return self._ranked_owners
        ratio, now = self._usage.ratio, self._now
        keyed = sorted(
            (ratio(owner, now), queue.earliest(), owner)
            for owner, queue in self._owner_queues.items()
        )
        self._ranked_owners = [(owner, self._owner_queues[owner]) for _, _, owner in keyed]
        self._ranked_at = (now, self._queued)
        return self._ranked_owners

    def _in_order(self) -> Iterable[tuple[int, Demand]]:
        """The waiters in queue order (rule 9): FIFO while one owner at one priority waits."""
        if not self._fair:
            return self._queue.items()
        return self._fair_items(self._ranked())

    def _fair_items(
        self, ranked: list[tuple[Hashable, OwnerQueue]]
    ) -> Iterator[tuple[int, Demand]]:
        queue = self._queue
        for _, owner_queue in ranked:
            for ticket in owner_queue:
                yield ticket, queue[ticket]

    def _first(self) -> int:
        """The first waiter in queue order (the queue is not empty)."""
        if not self._fair:
            return next(iter(self._queue))
        return self._ranked()[0][1].first()

    # --------------------------------------------------------- limits (rule 11)
    def _limits_of(self, owner: Hashable) -> OwnerLimits | None:
        """``owner``'s limits, or None where it has none."""
        limits = self._limits.get(owner, self._default_limits)
        return limits if limits is not None and limits.active else None

    def _charge(self, demand: Demand) -> float:
        """The GPUs ``demand`` counts against its owner's ``gpus`` limit: the most it could
        count wherever it lands (``u`` units on a GPU of ``total`` count ``u / total``)."""
        if demand.whole or demand.count > 1:
            return float(demand.count)
        totals = self._totals
        if self._uniform:
            return demand.units / totals[0]
        if demand.relative:
            return max(_share(demand.units, total) / total for total in totals)
        return max(demand.units / total for total in totals if total >= demand.units)

    def _unit_charge(self, demand: Demand) -> int:
        """The units ``demand`` counts against its owner's ``units`` limit: the most it
        could hold wherever it lands (whole GPUs: the largest ones)."""
        if demand.whole or demand.count > 1:
            return sum(sorted(self._totals, reverse=True)[: demand.count])
        if demand.relative:
            return max(self._needs_of(demand))
        return demand.units

    def _committed(self, owner: Hashable, ticket: int | None) -> tuple[float, int, int]:
        """The GPUs, grants and units ``owner`` holds, plus those its waiters that reserve
        (other than ``ticket``) keep room for: a waiter that reserves stays within limits."""
        usage, queue = self._usage, self._queue
        gpus, grants, units = usage.running(owner), usage.grants(owner), usage.units(owner)
        if self._easy:
            head = self._head
            reserving: Iterable[int] = () if head is None else (head.ticket,)
        else:
            reserving = self._reserved
        for other in reserving:
            if other != ticket and other in queue and queue[other].owner == owner:
                gpus += self._charge(queue[other])
                grants += 1
                units += self._unit_charge(queue[other])
        return gpus, grants, units

    def _hold(self, ticket: int | None, demand: Demand) -> LimitHold | None:
        """Why ``demand`` (waiter ``ticket``, or a new arrival: None) may not be granted now
        under its owner's limits, or None if it may (rule 11)."""
        limits = self._limits_of(demand.owner)
        if limits is None or (
            limits.running is None and limits.gpus is None and limits.units is None
        ):
            return None
        gpus, grants, units = self._committed(demand.owner, ticket)
        if limits.running is not None and grants + 1 > limits.running:
            return LimitHold(demand.owner, "running", limits.running, grants, 1)
        if limits.gpus is not None:
            need = self._charge(demand)
            if gpus + need > limits.gpus + EPSILON:
                return LimitHold(demand.owner, "gpus", limits.gpus, gpus, need)
        if limits.units is not None:
            asks = self._unit_charge(demand)
            if units + asks > limits.units:
                return LimitHold(demand.owner, "units", limits.units, units, asks)
        return None

    def _first_eligible(self) -> int | None:
        """The first waiter in queue order that no limit holds, or None (rule 11; under
        ``easy``, where a head is chosen)."""
        ranked = self._ranked() if self._fair else list(self._owner_queues.items())
        firsts: dict[Hashable, tuple[int, int]] | None = None
        for owner, owner_queue in ranked:
            if self._limits_of(owner) is None:
                return owner_queue.first()
            if firsts is None:
                firsts = self._first_eligible_per_owner()
            first = firsts.get(owner)
            if first is not None:
                return first[1]
        return None

    def _first_eligible_per_owner(self) -> dict[Hashable, tuple[int, int]]:
        """Per owner with limits, ``(-priority, ticket)`` of its first waiter that no limit
        holds (rule 10's order within an owner), judged per demand by its earliest waiter:
        every waiter of one demand asks the same of the same owner, so one decides for all
        (O(demands), whatever the queue's length)."""
        firsts: dict[Hashable, tuple[int, int]] = {}
        for demand, tickets in self._classes.items():
            owner = demand.owner
            ticket = next(iter(tickets))
            key = (-demand.priority, ticket)
            known = firsts.get(owner)
            if (
                (known is None or key < known)
                and self._limits_of(owner) is not None
                and self._hold(ticket, demand) is None
            ):
                firsts[owner] = key
        return firsts

    def _refuse_never(self, demand: Demand) -> None:
        """LimitExceeded if ``demand`` asks more GPUs or units than its owner may ever hold."""
        limits = self._limits_of(demand.owner)
        if limits is None:
            return
        if limits.units is not None and self._unit_charge(demand) > limits.units:
            asks = self._unit_charge(demand)
            raise LimitExceeded(
                demand.owner, "units", limits.units, asks,
                f"a request for {asks} could never run",
            )  # fmt: skip
        if limits.gpus is None:
            return
        need = self._charge(demand)
        if need > limits.gpus + EPSILON:
            raise LimitExceeded(
                demand.owner, "gpus", limits.gpus, need,
                f"a request for {need:g} GPU{'' if need == 1 else 's'} could never run",
            )  # fmt: skip

    def _refuse_beyond(
        self, demand: Demand, now: float, hint: float | None, *, queues: bool = True
    ) -> None:
        """LimitExceeded, changing nothing, for a request its owner's limits refuse (rule
        11): one that could never run; under ``mode="refuse"``, one beyond the ``gpus`` or
        ``running`` limit counting what the owner holds and has waiting; if it ``queues``
        (a submit, not a grant_now), one that would wait beyond the ``queued`` limit."""
        self._refuse_never(demand)
        owner = demand.owner
        limits = self._limits_of(owner)
        if limits is None:
            return
        count, asked, asked_units = self._waiting_of.get(owner, (0.0, 0.0, 0.0))
        waiting = int(count)
        if limits.mode == "refuse":
            grants = self._usage.grants(owner)
            if limits.running is not None and grants + waiting + 1 > limits.running:
                raise LimitExceeded(
                    owner, "running", limits.running, grants + waiting + 1,
                    f"it has {grants} running and {waiting} waiting, and refuses more",
                )  # fmt: skip
            held = self._usage.running(owner)
            need = self._charge(demand)
            if limits.gpus is not None and held + asked + need > limits.gpus + EPSILON:
                raise LimitExceeded(
                    owner, "gpus", limits.gpus, held + asked + need,
                    f"it holds {held:g} and asks {asked:g} waiting, and this request "
                    f"asks {need:g} more",
                )  # fmt: skip
            held_units, asks = self._usage.units(owner), self._unit_charge(demand)
            if limits.units is not None and held_units + asked_units + asks > limits.units:
                raise LimitExceeded(
                    owner, "units", limits.units, held_units + asked_units + asks,
                    f"it holds {held_units} and asks {asked_units:g} waiting, and this "
                    f"request asks {asks} more",
                )  # fmt: skip
        if (
            queues
            and limits.queued is not None
            and waiting >= limits.queued
            and self._would_wait(demand, now, hint)
        ):
            raise LimitExceeded(
                owner, "queued", limits.queued, waiting + 1,
                f"it has {waiting} waiting, and this request would wait",
            )  # fmt: skip

    def _would_wait(self, demand: Demand, now: float, hint: float | None) -> bool:
        """Whether a new arrival ``demand`` would wait: placed as :meth:`submit` would place
        it, then given back (with limits the placement only changes ``free``)."""
        gpus = self._place_new_easy(demand, hint, now) if self._easy else self._take_new(demand)
        if gpus is None:
            return True
        for gpu in gpus:
            self._free[gpu] += self._need(demand, gpu)
        return False

    def _needs_of(self, demand: Demand) -> list[int]:
        """Units a relative ``demand`` needs on each GPU (rule 1), memoised per share."""
        needs = self._relative_needs.get(demand.units)
        if needs is None:
            needs = [_share(demand.units, total) for total in self._totals]
            if len(self._relative_needs) < 4096:
                self._relative_needs[demand.units] = needs
        return needs

    def _index_of(self, demand: Demand) -> _DemandIndex:
        return self._whole_index if demand.count > 1 or demand.whole else self._fraction_index

    def _key_of(self, demand: Demand) -> int:
        """``demand``'s key in its index: a count of whole GPUs, else the units it needs on
        the GPU where it needs the fewest (a lower bound, which keeps the early stop safe)."""
        if demand.count > 1 or demand.whole:
            return demand.count
        if demand.relative:
            return _share(demand.units, self._smallest)
        return demand.units

    def _take_new(self, demand: Demand) -> tuple[int, ...] | None:
        """Take capacity for a new arrival where it fits without jumping the queue, or None."""
        if not self._fast:
            if self._limited and self._hold(None, demand) is not None:
                return None
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

    def _tally(self, seen: tuple[dict[int, int], dict[int, int]], demand: Demand) -> None:
        if demand.count > 1 or demand.whole:
            counts, key = seen[1], demand.count
        else:
            counts, key = seen[0], self._key_of(demand) if demand.relative else demand.units
        counts[key] = counts.get(key, 0) + 1

    def _walk(self) -> list[Grant]:
        """Recompute reservations in queue order and grant every waiter that fits (rules 3-5).

        This runs on every release, so the common step (a single-GPU waiter that does not fit
        and reserves the next most-free GPU) is written out inline. Once reservations stop,
        the walk counts the demands it has passed, to stop when nothing further back can fit.
        """
        if not self._fast:
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
        for ticket, demand in self._in_order():
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
                seen = self._seen_upto(visited)
        order.p = p
        return self._dequeued(grants)

    def _dequeued(self, grants: list[Grant]) -> list[Grant]:
        """Take the waiters a walk granted out of the queue and its index; return ``grants``
        (counted in usage here, unless limits counted each as it was made)."""
        for grant in grants:
            done = self._unqueue(grant.ticket)
            self._index_of(done).remove(self._key_of(done))
            if not self._limited:
                self._accounted(grant, done.owner)
        return grants

    # ------------------------------------------------- GPUs of different sizes (plain walk)
    def _units_of(self, demand: Demand, gpus: tuple[int, ...]) -> int:
        """``Grant.units`` for ``demand`` on ``gpus``: 0 for whole GPUs of different sizes,
        what a relative demand needs on its one GPU."""
        if demand.relative:
            return self._needs_of(demand)[gpus[0]]
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
        if demand.count > 1 and self._groups is not None:
            return self._fit_grouped(demand.count, gpus, take)
        if demand.whole or demand.count > 1:
            idle = [gpu for gpu in gpus if free[gpu] == totals[gpu]]
            if len(idle) < demand.count:
                return None
            if demand.count > 1 and self._sibling_of:
                idle = self._one_per_memory(idle)
                if len(idle) < demand.count:
                    return None
            chosen = tuple(sorted(sorted(idle, key=totals.__getitem__)[: demand.count]))
            if take:
                for gpu in chosen:
                    free[gpu] = 0
            return chosen
        if demand.relative:
            return self._fit_relative(self._needs_of(demand), gpus, take)
        units, best, best_free = demand.units, -1, self.units_per_gpu + 1  # none fits yet
        for gpu in gpus:
            f = free[gpu]
            if units <= f <= best_free and (f < best_free or gpu < best):
                best, best_free = gpu, f
        if best < 0:
            return None
        if take:
            free[best] -= units
        return (best,)

    def _fit_grouped(self, count: int, gpus: Iterable[int], take: bool) -> tuple[int, ...] | None:
        """Rule 12's placement of ``count`` whole GPUs among ``gpus``: rule 2 within one
        group, the group whose choice has the smallest totals, then the fewest completely
        free GPUs, then the lowest index; taken if ``take``."""
        free, totals = self._free, self._totals
        idle = {gpu for gpu in gpus if free[gpu] == totals[gpu]}
        best: tuple[tuple[int, int, int], tuple[int, ...]] | None = None
        for members in self._groups or ():
            here = self._one_per_memory(gpu for gpu in members if gpu in idle)
            if len(here) < count:
                continue
            chosen = tuple(sorted(sorted(here, key=totals.__getitem__)[:count]))
            rank = (sum(totals[gpu] for gpu in chosen), len(here), chosen[0])
            if best is None or rank < best[0]:
                best = (rank, chosen)
        if best is None:
            return None
        if take:
            for gpu in best[1]:
                free[gpu] = 0
        return best[1]

    def _fit_relative(
        self, needs: list[int], gpus: Iterable[int], take: bool
    ) -> tuple[int, ...] | None:
        """Best fit (rule 2) for a relative demand needing ``needs[g]`` on GPU ``g``: the
        fitting GPU among ``gpus`` with the least left after the grant, ties lowest index."""
        free = self._free
        best, best_left = -1, -1
        for gpu in gpus:
            left = free[gpu] - needs[gpu]
            if left >= 0 and (best < 0 or left < best_left or (left == best_left and gpu < best)):
                best, best_left = gpu, left
        if best < 0:
            return None
        if take:
            free[best] -= needs[best]
        return (best,)

    def _reserve_general(self, demand: Demand, open_gpus: list[int]) -> tuple[int, ...] | None:
        """The GPUs ``demand`` reserves among ``open_gpus`` (rule 3), removed from it."""
        if demand.count > 1 and self._groups is not None:
            return self._reserve_grouped(demand.count, open_gpus)
        free, totals = self._free, self._totals
        if demand.whole or demand.count > 1:
            if len(open_gpus) < demand.count:
                return None
            ranked = sorted(open_gpus, key=lambda gpu: (totals[gpu] - free[gpu], gpu))
            if demand.count > 1:
                ranked = self._one_per_memory(ranked)
                if len(ranked) < demand.count:
                    return None
            chosen = tuple(sorted(ranked[: demand.count]))
            for gpu in chosen:
                open_gpus.remove(gpu)
            return chosen
        if demand.relative:  # the most free beyond its need (any GPU could hold it)
            needs = self._needs_of(demand)
            best = min(open_gpus, key=lambda gpu: (needs[gpu] - free[gpu], gpu), default=-1)
        else:
            best, best_free = -1, -1  # the most free GPU that could hold it
            for gpu in open_gpus:
                if totals[gpu] >= demand.units:
                    f = free[gpu]
                    if f > best_free or (f == best_free and gpu < best):
                        best, best_free = gpu, f
        if best < 0:
            return None
        open_gpus.remove(best)
        return (best,)

    def _reserve_grouped(self, count: int, open_gpus: list[int]) -> tuple[int, ...] | None:
        """Rule 12 under ``reserve-all``: the ``count`` GPUs of ``open_gpus`` with the fewest
        units in use within one group, the group where those have the fewest in all (ties:
        the lowest index), removed from ``open_gpus``; None if no group has ``count`` open
        GPUs."""
        free, totals = self._free, self._totals
        open_set = set(open_gpus)
        best: tuple[tuple[int, int], tuple[int, ...]] | None = None
        for members in self._groups or ():
            here = [gpu for gpu in members if gpu in open_set]
            ranked = self._one_per_memory(
                sorted(here, key=lambda gpu: (totals[gpu] - free[gpu], gpu))
            )[:count]
            if len(ranked) < count:
                continue
            chosen = tuple(sorted(ranked))
            rank = (sum(totals[gpu] - free[gpu] for gpu in chosen), chosen[0])
            if best is None or rank < best[0]:
                best = (rank, chosen)
        if best is None:
            return None
        for gpu in best[1]:
            open_gpus.remove(gpu)
        return best[1]

    def _submit_general(self, demand: Demand) -> tuple[int, Grant | None]:
        ticket = next(self._tickets)
        gpus = self._take_new(demand)
        if gpus is not None:
            grant = _grant((ticket, gpus, self._units_of(demand, gpus)))
            return ticket, self._accounted(grant, demand.owner)
        if not self._queue:
            self._open = list(range(self.num_gpus))
            self._reserving = True
        self._enqueue(ticket, demand)
        self._index_of(demand).add(self._key_of(demand))
        if self._limited and self._hold(ticket, demand) is not None:
            return ticket, None  # held by its owner's limit: it reserves nothing (rule 11)
        if self._reserving:
            chosen = self._reserve_general(demand, self._open)
            if chosen is None:
                self._reserving = False
            else:
                self._reserved[ticket] = chosen
                if self._sibling_of:
                    self._close_siblings(self._open, chosen)
        return ticket, None

    def _could_serve_rest_general(
        self, open_gpus: list[int], seen: tuple[dict[int, int], dict[int, int]]
    ) -> bool:
        """Whether any waiter not yet visited could fit on ``open_gpus``."""
        free, totals = self._free, self._totals
        # A relative demand's key is its need on the smallest GPU: a lower bound, so this
        # may walk on where nothing fits, but never stops where something would.
        smallest = self._fraction_index.min_excluding(seen[0])
        if smallest is not None and any(free[gpu] >= smallest for gpu in open_gpus):
            return True
        fewest = self._whole_index.min_excluding(seen[1])
        idle = sum(1 for gpu in open_gpus if free[gpu] == totals[gpu])
        return fewest is not None and idle >= fewest

    def _relative_pass(self, demand: Demand, open_gpus: list[int]) -> tuple[int, int, int]:
        """The walk's one pass for a relative demand: its best fit among ``open_gpus`` (-1:
        none), the GPU it would reserve (the most free beyond its need; every GPU could hold
        it), and what it needs on the best fit."""
        free, needs = self._free, self._needs_of(demand)
        fit, fit_left, most, most_left = -1, 0, -1, 0
        for gpu in open_gpus:  # in index order, so ties go to the lowest index
            left = free[gpu] - needs[gpu]
            if left >= 0:
                if fit < 0 or left < fit_left:
                    fit, fit_left = gpu, left
            elif most < 0 or left > most_left:
                most, most_left = gpu, left
        return fit, most, needs[fit] if fit >= 0 else 0

    def _held_in_walk(
        self, ticket: int, demand: Demand, held: tuple[set[Hashable], set[Demand]]
    ) -> bool:
        """Whether a limit holds waiter ``ticket`` in a walk (rule 11), remembering in
        ``held`` the owners at their ``running`` limit and the demands past another: what
        an owner holds and reserves only grows during a walk, so they stay held, and each
        further waiter of them costs a set lookup."""
        owners, demands = held
        if demand.owner in owners or demand in demands:
            return True
        hold = self._hold(ticket, demand)
        if hold is None:
            return False
        if hold.limit == "running":
            owners.add(demand.owner)
        else:
            demands.add(demand)
        return True

    def _absolute_pass(self, units: int, open_gpus: list[int]) -> tuple[int, int, int]:
        """The walk's one pass for ``units`` on one GPU: its best fit among ``open_gpus``
        (-1: none), the GPU it would reserve (the most free that could hold it), and
        ``units``."""
        free, totals = self._free, self._totals
        fit, fit_free, most, most_free = -1, -1, -1, -1
        for gpu in open_gpus:  # in index order, so ties go to the lowest index
            f = free[gpu]
            if f >= units:
                if fit < 0 or f < fit_free:
                    fit, fit_free = gpu, f
            elif f > most_free and totals[gpu] >= units:
                most, most_free = gpu, f
        return fit, most, units

    def _seen_upto(self, visited: int) -> tuple[dict[int, int], dict[int, int]]:
        """The demands of the first ``visited`` waiters, tallied for the early stop."""
        seen: tuple[dict[int, int], dict[int, int]] = ({}, {})
        for _, passed in itertools.islice(self._in_order(), visited):
            self._tally(seen, passed)
        return seen

    def _walk_general(self) -> list[Grant]:
        """Rules 3-5 on GPUs of different sizes, with the same early stop as the fast walk."""
        reserved = self._reserved
        reserved.clear()
        free = self._free
        grants: list[Grant] = []
        open_gpus = list(range(self.num_gpus))
        reserving = True
        seen: tuple[dict[int, int], dict[int, int]] | None = None
        visited = 0
        limited = self._limited
        held: tuple[set[Hashable], set[Demand]] = (set(), set())  # owners, demands held
        for ticket, demand in self._in_order():
            if not open_gpus:
                break
            visited += 1
            if seen is not None:
                if not self._could_serve_rest_general(open_gpus, seen):
                    break
                self._tally(seen, demand)
            if limited and self._held_in_walk(ticket, demand, held):
                continue  # held by its owner's limit: neither granted nor reserving (rule 11)
            if demand.count == 1 and not demand.whole and not limited:  # one pass (see below)
                fit, most, units = (
                    self._relative_pass(demand, open_gpus)
                    if demand.relative
                    else self._absolute_pass(demand.units, open_gpus)
                )
                if fit >= 0:
                    free[fit] -= units
                    grants.append(_grant((ticket, (fit,), units)))
                    continue
                if reserving:
                    if most >= 0:
                        open_gpus.remove(most)
                        reserved[ticket] = (most,)
                        if self._sibling_of:
                            self._close_siblings(open_gpus, (most,))
                        continue
                    reserving, seen = False, self._seen_upto(visited)
                continue
            taken = self._fit_general(demand, open_gpus, take=True)
            if taken is not None:
                grants.append(_grant((ticket, taken, self._units_of(demand, taken))))
                if limited:  # counted now: the next waiter's limit reads it
                    self._accounted(grants[-1], demand.owner)
                continue
            if reserving:
                chosen = self._reserve_general(demand, open_gpus)
                if chosen is not None:
                    reserved[ticket] = chosen
                    if self._sibling_of:
                        self._close_siblings(open_gpus, chosen)
                    continue
                reserving, seen = False, self._seen_upto(visited)
        self._open, self._reserving = open_gpus, reserving
        return self._dequeued(grants)

    # ----------------------------------------------------------------- withheld capacity
    def withhold(self, gpu: int, units: int, *, now: float | None = None) -> list[Grant]:
        """Make ``units`` of ``gpu`` unavailable, as a lease held by no one would; return the
        waiters granted as a result (when less is withheld than before).

        ``units`` is the amount withheld from now on (it replaces the previous one; 0 gives
        everything back). What is withheld is taken from the GPU's free units even where
        leases hold them: free may go below zero, and nothing new is granted there until
        releases cover it. The queue is walked again, as after a release, so reservations
        see the new free units. The host server calls this with the memory that processes
        outside the queue hold. Raises ValueError (or TypeError), changing nothing, for an
        unknown GPU, units outside 0..the GPU's total, or a bad ``now``.
        """
        gpu = self._check_gpu(gpu)
        units = check_int("units to withhold", units, minimum=0, maximum=self._totals[gpu])
        clock = self._time(now)
        before = self._withheld[gpu]
        if units == before:
            return []
        at = self._commit(clock)
        self._withheld[gpu] = units
        self._free[gpu] -= units - before
        if not self._queue:
            return []
        return self._walk_easy(at) if self._easy else self._walk()

    @property
    def withheld(self) -> tuple[int, ...]:
        """Units withheld per GPU (:meth:`withhold`); all 0 unless the caller withheld some."""
        return tuple(self._withheld)

    def _take_withheld(self) -> None:
        """Take what is withheld out of the free units again (after :meth:`rebuild` made
        every GPU free)."""
        for gpu, units in enumerate(self._withheld):
            self._free[gpu] -= units

    def restore(
        self,
        gpus: tuple[int, ...],
        units: int,
        *,
        now: float | None = None,
        owner: Hashable = None,
        since: float | None = None,
    ) -> Grant:
        """Re-create a grant that was held before a restart: ``units`` on each of ``gpus``,
        counted in ``owner``'s usage from ``since`` (the caller's clock, when it was really
        granted; None or later than now: from now), decayed as if this core had seen it all
        along (rule 8), so that a restart neither forgives nor inflates it.

        The host server calls this while its clients re-declare their leases, before it
        queues anything, so no reservation or queue walk is involved; it checks the owner's
        limits first (:meth:`check_restore`). Raises ValueError, changing nothing, if
        requests wait, ``gpus`` is empty, repeats or names an unknown GPU, or any of them has
        fewer than ``units`` free.
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
        hash(owner)  # TypeError for an owner that cannot be one, before any change
        at = self._commit(self._time(now))
        if owner is not None:
            self._count_usage()
        for gpu in gpus:
            self._free[gpu] -= units
        grant = Grant(next(self._tickets), tuple(gpus), units)
        held = dict.fromkeys(gpus, units)
        if self._easy:  # held from before: its start is not learned from
            account = self._usage.hold(owner, held, at) if self._counting else None
            self._durations.start(grant.ticket, None, held, at, None, account)
        else:
            self._accounted(grant, owner)
        if since is not None and self._counting:
            self._usage.backdate(owner, held, since, at)
        return grant

    def check_restore(self, owner: Hashable, held: Mapping[int, int]) -> None:
        """LimitExceeded, changing nothing, where taking back a grant holding ``held`` (GPU ->
        units) would take ``owner`` past its ``gpus``, ``running`` or ``units`` limit (rule
        11), whatever its mode: a grant that is held already cannot wait. What a grant held
        before a restart goes through, as a new request goes through :meth:`submit`'s."""
        limits = self._limits_of(owner)
        if limits is None:
            return
        usage = self._usage
        grants = usage.grants(owner)
        if limits.running is not None and grants + 1 > limits.running:
            raise LimitExceeded(
                owner, "running", limits.running, grants + 1,
                f"it holds {grants} and this lease would be one more",
            )  # fmt: skip
        has, adds = usage.running(owner), sum(u / self._totals[g] for g, u in held.items())
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

    def rebuild(
        self,
        held: Iterable[tuple[int, Iterable[tuple[int, int]]]],
        waiting: Iterable[tuple[int, Demand, float | None]],
        *,
        now: float | None = None,
    ) -> list[Grant]:
        """Start over from what the caller knows; return the waiters granted as a result.

        The core's calls are not atomic: an exception inside one (KeyboardInterrupt from a
        signal handler, MemoryError) can leave it half done, with capacity taken by no grant
        or a ticket half queued. A caller that saw one hands in what its own callers hold,
        ``(ticket, ((gpu, units), ...))`` per grant, and the requests still waiting,
        ``(ticket, demand, expected)``, with the tickets this core gave them. The core keeps
        only its clock, its ticket numbers and the hold times learned so far, takes the held
        capacity, queues the waiting requests in ticket order (the order they came in) and
        grants what now fits, as a release would. A request cut short by the exception is in
        neither list: it had no effect. Grants held from before are learned from no more.
        Raises ValueError (or TypeError), changing nothing, for a bad GPU, units, ticket,
        demand or ``now``, a repeated ticket, or more held on a GPU than its total.
        """
        clock = self._time(now)
        grants, queue = self._checked_books(held, waiting)
        at = self._commit(clock)
        self._start_over()
        self._take_withheld()
        self._durations.forget_runs()
        self._usage.forget_grants(at)
        for ticket, parts in grants:
            for gpu, units in parts:
                self._free[gpu] -= units
            # The books carry no owner: a held grant counts as owner None's from now.
            if self._easy:  # its start is unknown here, so nothing is learned from it
                on_gpus = dict(parts)
                account = self._usage.hold(None, on_gpus, at) if self._counting else None
                self._durations.start(ticket, None, on_gpus, at, None, account)
            else:
                self._usage.start(ticket, None, parts, at)
        for ticket, demand, hint in queue:
            self._enqueue(ticket, demand)
            if not self._easy:
                self._index_of(demand).add(self._key_of(demand))
            else:
                self._class_add(ticket, demand, hint)
        if not queue:
            return []
        return self._walk_easy(at) if self._easy else self._walk()

    def _checked_books(
        self,
        held: Iterable[tuple[int, Iterable[tuple[int, int]]]],
        waiting: Iterable[tuple[int, Demand, float | None]],
    ) -> tuple[
        list[tuple[int, tuple[tuple[int, int], ...]]], list[tuple[int, Demand, float | None]]
    ]:
        """What :meth:`rebuild` is given, checked (changing nothing); the waiting in order."""
        grants = [(ticket, self._checked_parts(ticket, parts)) for ticket, parts in held]
        queue = sorted((self._checked_waiter(*entry) for entry in waiting), key=_first)
        tickets = [ticket for ticket, _ in grants] + [entry[0] for entry in queue]
        if len(set(tickets)) != len(tickets):
            raise ValueError(f"tickets must be distinct, got {sorted(tickets)}")
        taken = [0] * self.num_gpus
        for _, parts in grants:
            for gpu, units in parts:
                taken[gpu] += units
        for gpu, units in enumerate(taken):
            if units > self._totals[gpu]:
                raise ValueError(
                    f"cannot hold {units} units on GPU {gpu}: its total is {self._totals[gpu]}"
                )
        return grants, queue

    def _checked_parts(
        self, ticket: object, parts: Iterable[tuple[int, int]]
    ) -> tuple[tuple[int, int], ...]:
        """A held grant's ``(gpu, units)`` for :meth:`rebuild`, checked: distinct GPUs."""
        _check_rebuilt_ticket(ticket)
        checked = tuple((self._check_gpu(gpu), self._check_units(units)) for gpu, units in parts)
        gpus = [gpu for gpu, _ in checked]
        if not gpus or len(set(gpus)) != len(gpus):
            raise ValueError(
                f"grant {ticket!r} must hold distinct GPUs, at least one, got {list(checked)}"
            )
        return checked

    def _checked_waiter(
        self, ticket: object, demand: Demand, hint: float | None
    ) -> tuple[int, Demand, float | None]:
        """A waiting request for :meth:`rebuild`, checked, its demand as the walk takes it."""
        return _check_rebuilt_ticket(ticket), self._admit(demand), check_timeout(hint, "expected")

    # ------------------------------------------------------------ easy (rules 3e-7e)
    def _submit_easy(
        self, demand: Demand, now: float, hint: float | None
    ) -> tuple[int, Grant | None]:
        gpus = self._place_new_easy(demand, hint, now)
        ticket = next(self._tickets)
        if gpus is not None:
            return ticket, self._granted(ticket, demand, gpus, now, hint)
        self._enqueue(ticket, demand)
        self._class_add(ticket, demand, hint)
        if self._head is None:  # the queue was empty, or every other waiter is held
            if not self._limited or self._hold(ticket, demand) is None:
                self._head = self._choose_head(ticket, demand, now)
        elif self._fair:
            self._head = self._yield_head(self._head, now)
        return ticket, None

    def _place_new_easy(
        self, demand: Demand, hint: float | None, now: float
    ) -> tuple[int, ...] | None:
        """Take capacity for a new arrival: best fit anywhere if none wait, else a backfill
        (rule 4e), never ahead of an earlier waiter of its demand without a hint."""
        if self._limited and self._hold(None, demand) is not None:
            return None  # held by its owner's limit (rule 11)
        if not self._queue:  # best fit over every GPU (the fast path on GPUs of one size)
            return (
                self._take_new(demand) if self._fast else self._fit_general(demand, None, take=True)
            )
        if demand in self._classes:
            return None  # an earlier one like it waits, and the same would stop it
        return self._backfill_fit(demand, now, hint)

    def _granted(
        self, ticket: int, demand: Demand, gpus: tuple[int, ...], now: float, hint: float | None
    ) -> Grant:
        units = self._units_of(demand, gpus) if demand.whole or demand.relative else demand.units
        grant = _grant((ticket, gpus, units))
        if len(gpus) == 1 and units:
            held = {gpus[0]: units}
        else:
            held = dict.fromkeys(gpus, units) if units else {g: self._totals[g] for g in gpus}
        account = self._usage.hold(demand.owner, held, now) if self._counting else None
        self._durations.start(ticket, _class_of(demand), held, now, hint, account, demand.limit)
        return grant

    def _class_add(self, ticket: int, demand: Demand, hint: float | None) -> None:
        """Put a waiter at the end of its demand's class (and keep its hint)."""
        waiting = self._classes.get(demand)
        if waiting is None:
            waiting = self._classes[demand] = OrderedDict()
            if not self._by_size(demand):
                self._unsized[demand] = waiting
        waiting[ticket] = None
        if hint is not None:
            self._hints[ticket] = hint
        if len(waiting) == 1 and demand not in self._unsized:
            self._sizes.set(demand.units, demand, ticket)

    def _dequeue(self, ticket: int) -> Demand:
        """Take a waiter out of the queue and out of its class (O(1) wherever it is)."""
        demand = self._unqueue(ticket)
        if self._yielded:
            self._yielded.discard(ticket)
        if self._hints:
            self._hints.pop(ticket, None)
        waiting = self._classes[demand]
        sized = demand not in self._unsized
        first = sized and ticket == next(iter(waiting))
        del waiting[ticket]
        if first:  # the index holds each class's first waiter
            self._sizes.set(demand.units, demand, next(iter(waiting), None))
        if not waiting:
            del self._classes[demand]
            if not sized:
                del self._unsized[demand]
        return demand

    def _by_size(self, demand: Demand) -> bool:
        """Whether ``demand`` fits during a walk by its units alone: a fractional demand
        without an enforced limit on GPUs of one size (rule 4e lets it onto the GPUs that
        have its units free, and onto a fractional head's GPU by what stays free for the
        head). Its class is then kept in the size index."""
        return (
            self._uniform
            and not self._by_estimates
            and demand.count == 1
            and not demand.whole
            and not demand.relative
            and demand.limit is None
        )

    def _need(self, demand: Demand, gpu: int) -> int:
        """Units ``demand`` needs free on ``gpu``: all of it for whole GPUs, its share of
        it for a relative demand."""
        if demand.whole or demand.count > 1:
            return self._totals[gpu]
        return self._needs_of(demand)[gpu] if demand.relative else demand.units

    def _choose_head(self, ticket: int, demand: Demand, now: float, *, moved: bool = False) -> Head:
        """The GPUs expected to have room for ``demand`` soonest, and when (rule 3e).

        Estimates are no finer than ``GRAIN`` times the demand's own expected hold, so every
        GPU expected within that of the soonest ones is as good, and among those the most
        free win, then the lowest index, as in rule 3 (with nothing known yet, rule 3's
        choice). GPUs too small never qualify. A relative head ranks by what is free beyond
        its need on each GPU, as rule 3 does (for an absolute one that is the most free).
        """
        if demand.count > 1 and self._groups is not None:
            return self._choose_head_grouped(ticket, demand, now, moved)
        free, durations = self._free, self._durations
        grain = GRAIN * (durations.mean(_class_of(demand)) or 0.0)
        timed = sorted(
            (durations.free_at(gpu, free[gpu], need, now), gpu)
            for gpu in range(self.num_gpus)
            if self._totals[gpu] >= (need := self._need(demand, gpu))
        )
        cutoff = timed[demand.count - 1][0] + grain
        ranked = sorted(
            (self._need(demand, gpu) - free[gpu] if demand.relative else -free[gpu], gpu, at)
            for at, gpu in timed
            if at <= cutoff
        )
        chosen = ranked[: demand.count]
        gpus = tuple(sorted(gpu for _, gpu, _ in chosen))
        return Head(ticket, gpus, max(at for _, _, at in chosen), now, moved)

    def _choose_head_grouped(self, ticket: int, demand: Demand, now: float, moved: bool) -> Head:
        """:meth:`_choose_head` for ``count > 1`` whole GPUs within one group (rule 12): the
        group whose ``count``-th GPU is expected to have room soonest (groups within the
        grain of that tie: the most units free on the GPUs it would reserve, then the lowest
        index), and within it rule 3e's choice."""
        free, totals, durations, count = self._free, self._totals, self._durations, demand.count
        grain = GRAIN * (durations.mean(_class_of(demand)) or 0.0)
        options: list[tuple[float, list[tuple[float, int]]]] = []
        for members in self._groups or ():
            if len(members) >= count:
                timed = sorted(
                    (durations.free_at(gpu, free[gpu], totals[gpu], now), gpu) for gpu in members
                )
                options.append((timed[count - 1][0], timed))
        soonest = min(basis for basis, _ in options)
        best: tuple[tuple[int, int], tuple[int, ...], float] | None = None
        for basis, timed in options:
            if basis > soonest + grain:
                continue
            cutoff = basis + grain
            chosen = sorted((-free[gpu], gpu, at) for at, gpu in timed if at <= cutoff)[:count]
            gpus = tuple(sorted(gpu for _, gpu, _ in chosen))
            rank = (-sum(free[gpu] for gpu in gpus), gpus[0])
            if best is None or rank < best[0]:
                best = (rank, gpus, max(at for _, _, at in chosen))
        assert best is not None, "an admitted demand fits in some group"
        return Head(ticket, best[1], best[2], now, moved)

    def _drain(self, head: Head, demand: Demand, now: float) -> float:
        """When the head's GPUs are expected to have room for it, as known now."""
        free, durations = self._free, self._durations
        return max(
            durations.free_at(gpu, free[gpu], self._need(demand, gpu), now) for gpu in head.gpus
        )

    def _backfill_fit(
        self, demand: Demand, now: float, hint: float | None
    ) -> tuple[int, ...] | None:
        """Best fit for a request behind the head, on the GPUs rule 4e lets it use: on the
        head's GPUs only what is sure not to delay it, by enforced limits alone (or, under
        ``backfill="estimates"``, what is expected not to)."""
        head = self._head
        if head is None:
            return self._fit_general(demand, None, take=True)
        allowed = self._open_for(head)
        if now < head.shadow:
            limit = demand.limit
            if self._by_estimates:
                guess = self._durations.guess(_class_of(demand), hint)
                if guess is not None and (limit is None or guess < limit):
                    limit = guess
            ends_in_time = limit is not None and now + limit <= head.shadow
            head_demand = self._queue[head.ticket]
            slack = (
                not (demand.whole or demand.count > 1)
                and head_demand.count == 1
                and not head_demand.whole
            )
            if ends_in_time or slack:
                allowed = list(allowed)
                if ends_in_time and self._sibling_of:  # rule 13: the head's memory groups
                    allowed += {
                        other
                        for gpu in head.gpus
                        for other in self._sibling_of.get(gpu, ())
                        if other not in head.gpus
                    }
                for gpu in head.gpus:
                    if ends_in_time or (
                        self._durations.free_by(
                            gpu, self._free[gpu], head.shadow, now, self._by_estimates
                        )
                        - self._need(demand, gpu)
                        >= self._need(head_demand, gpu)
                    ):
                        allowed.append(gpu)
                allowed.sort()
        return self._fit_general(demand, allowed, take=True)

    def _open_for(self, head: Head) -> list[int]:
        """The GPUs ``head`` does not reserve, kept per head: neither its GPUs nor, with
        memory groups, the other GPUs of their groups (rule 13)."""
        if self._open_of is not head:
            self._open_of = head
            closed = set(head.gpus)
            for gpu in head.gpus:
                closed.update(self._sibling_of.get(gpu, ()))
            self._open_easy = [gpu for gpu in range(self.num_gpus) if gpu not in closed]
        return self._open_easy

    @staticmethod
    def _siblings(shared: tuple[tuple[int, ...], ...] | None) -> dict[int, tuple[int, ...]]:
        """Per GPU of a memory group, the other GPUs of its group (rule 13)."""
        return {
            gpu: tuple(other for other in gpus if other != gpu)
            for gpus in shared or ()
            for gpu in gpus
        }

    def _close_siblings(self, open_gpus: list[int], reserved: tuple[int, ...]) -> None:
        """Rule 13 under ``reserve-all``: take the other GPUs of the memory groups of
        ``reserved`` out of ``open_gpus`` (nothing new draws on a reserved GPU's memory)."""
        for gpu in reserved:
            for other in self._sibling_of.get(gpu, ()):
                if other in open_gpus:
                    open_gpus.remove(other)

    def _walk_easy(self, now: float) -> list[Grant]:
        """Grant from the front while the first waiter fits anywhere (rule 5e), settle the
        head (rule 3e), then backfill behind it (rule 4e)."""
        grants: list[Grant] = []
        queue = self._queue
        head = self._head
        limited = self._limited
        fifo = not self._fair and self._resume is None and not limited
        while queue:  # the head, else the next head (rule 10e; rule 11: not a held one)
            if head is not None:
                ticket = head.ticket
            else:
                first = next(iter(queue)) if fifo else self._next_head()
                if first is None:
                    break  # every waiter is held by its owner's limit
                ticket = first
            demand = queue[ticket]
            if limited and head is not None and self._hold(ticket, demand) is not None:
                head = None  # its owner's limit holds it now: choose another
                continue
            gpus = self._fit_general(demand, None, take=True)
            if gpus is None:
                break
            hint = self._hints.get(ticket) if self._hints else None
            self._dequeue(ticket)
            grants.append(self._granted(ticket, demand, gpus, now, hint))
            head = None
        if not queue:
            self._head = None
            return grants
        kept = head
        if head is None:
            first = self._next_head()
            if first is None:  # every waiter is held by its owner's limit (rule 11)
                self._head = None
                return grants
            head = self._choose_head(first, queue[first], now)
        if self._fair:
            head = self._yield_head(head, now)
        if head is kept and now >= head.shadow and not head.moved:  # overdue: move once
            ticket, demand = head.ticket, queue[head.ticket]
            better = self._choose_head(ticket, demand, now, moved=True)
            if better.gpus != head.gpus and better.shadow < self._drain(head, demand, now):
                head = better._replace(since=head.since)
        self._head = head
        self._backfill(head, now, grants)
        return grants

    def _backfill(self, head: Head, now: float, grants: list[Grant]) -> None:
        """Offer capacity to the waiters behind ``head`` in queue order (rule 4e).

        Waiters are taken per demand (its size, owner, priority and limit), the earliest of
        each first: once one is refused, the rest of its demand would be too (capacity only
        falls during the walk), so each walk looks at one waiter per demand plus those
        granted. The streams merge on the ticket, or, when owners or priorities differ, on
        (the owner's rank, minus the priority, the ticket): the queue order of rule 9.
        """
        queue, free = self._queue, self._free
        top = max(free)
        if top == 0:
            return
        if not self._fair and self._fast and not self._by_estimates:
            self._backfill_by_size(head, now, grants, top)
            return
        idle = self._idle_count()
        # Only demands that could fit somewhere now: the others wait whatever the rules say.
        # (A relative demand is judged by its need on the smallest GPU: a lower bound.)
        fair = self._fair
        rank = {owner: i for i, (owner, _) in enumerate(self._ranked())} if fair else {}
        streams: list[Iterator[Any]] = [
            (
                iter(waiting)
                if not fair
                else self._keyed(waiting, rank[demand.owner], -demand.priority)
            )
            for demand, waiting in self._classes.items()
            if (
                demand.count <= idle
                if demand.whole or demand.count > 1
                else self._key_of(demand) <= top
            )
        ]
        heap: list[tuple[Any, int]] = []
        for index, stream in enumerate(streams):
            key = next(stream, None)
            if key is not None and (key[2] if fair else key) == head.ticket:
                key = next(stream, None)
            if key is not None:
                heap.append((key, index))
        heapq.heapify(heap)
        granted: list[tuple[int, Demand]] = []
        # Sizes (with their limit) refused, whatever their owner (when fair).
        refused: set[Hashable] = set()
        hints = self._hints
        limited = self._limited
        while heap and any(free):
            key, index = heap[0]
            ticket = key[2] if fair else key
            demand = queue[ticket]
            size = (_class_of(demand), demand.limit) if fair else None
            if fair and size in refused:
                heapq.heappop(heap)  # another owner's waiter of this size was refused
                continue
            if limited and self._hold(ticket, demand) is not None:
                heapq.heappop(heap)  # held by its owner's limit, and so is the rest of it
                continue
            hint = hints.get(ticket) if hints else None
            gpus = self._backfill_fit(demand, now, hint)
            if gpus is None:
                heapq.heappop(heap)  # the rest of this demand waits too
                if fair:
                    refused.add(size)
                continue
            grants.append(self._granted(ticket, demand, gpus, now, hint))
            granted.append((ticket, demand))
            following = next(streams[index], None)
            if following is not None and fair and following[2] == head.ticket:
                following = next(streams[index], None)  # the head, behind others in order
            if following is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (following, index))
        for ticket, _ in granted:
            self._dequeue(ticket)

    def _backfill_by_size(self, head: Head, now: float, grants: list[Grant], top: int) -> None:
        """:meth:`_backfill` in FIFO order on GPUs of one size, in O(log n) per grant.

        The same decisions: waiters in ticket order, one per demand until one is refused.
        A sized demand (see :meth:`_by_size`) fits iff its units are at most
        :meth:`_sized_room`, which only falls during the walk, so instead of offering every
        sized class its turn (and refusing most), the walk asks the size index for the
        earliest waiter among the classes that fit now; a class that would have been refused
        is never returned. Nor is the head (nor its class): it fits nowhere, or rule 5e
        would have granted it. The other demands (whole GPUs, enforced limits: a few)
        stream per class as in :meth:`_backfill`, merged with it on the ticket.
        """
        queue, free = self._queue, self._free
        idle = self._idle_count()
        streams: list[Iterator[int]] = [
            iter(waiting)
            for demand, waiting in self._unsized.items()
            if (demand.count <= idle if demand.whole or demand.count > 1 else demand.units <= top)
        ]
        heap: list[tuple[int, int]] = []
        for index, stream in enumerate(streams):
            ticket = next(stream, None)
            if ticket == head.ticket:
                ticket = next(stream, None)
            if ticket is not None:
                heap.append((ticket, index))
        heapq.heapify(heap)
        granted: list[int] = []
        hints = self._hints
        while any(free):
            sized = self._sizes.earliest(self._sized_room(head, now))
            if heap and (sized is None or heap[0][0] < sized):
                ticket, index = heap[0]
                demand = queue[ticket]
                hint = hints.get(ticket) if hints else None
                gpus = self._backfill_fit(demand, now, hint)
                if gpus is None:
                    heapq.heappop(heap)  # the rest of this demand waits too
                    continue
                grants.append(self._granted(ticket, demand, gpus, now, hint))
                granted.append(ticket)
                following = next(streams[index], None)
                if following is None:
                    heapq.heappop(heap)
                else:
                    heapq.heapreplace(heap, (following, index))
                continue
            if sized is None:
                break
            demand = queue[sized]
            hint = hints.get(sized) if hints else None
            gpus = self._backfill_fit(demand, now, hint)
            assert gpus is not None, "a sized demand within the room fits"
            self._dequeue(sized)  # its class is indexed under its next waiter
            grants.append(self._granted(sized, demand, gpus, now, hint))
        for ticket in granted:
            self._dequeue(ticket)

    def _sized_room(self, head: Head, now: float) -> int:
        """The most units a sized demand (see :meth:`_by_size`) may take now behind
        ``head``, by rule 4e: what is free on a GPU the head does not reserve, and, before
        the shadow of a fractional head, on the head's GPU what is free there and leaves the
        head its need at the shadow (by enforced limits alone)."""
        free = self._free
        self._open_for(head)
        room = max([free[gpu] for gpu in self._open_easy], default=0)
        if now < head.shadow:
            head_demand = self._queue[head.ticket]
            if head_demand.count == 1 and not head_demand.whole:
                for gpu in head.gpus:
                    slack = self._durations.free_by(gpu, free[gpu], head.shadow, now, False)
                    room = max(room, min(free[gpu], slack - self._need(head_demand, gpu)))
        return room

    def _idle_count(self) -> int:
        """How many GPUs are completely free."""
        free = self._free
        if self._uniform:
            return free.count(self.units_per_gpu)
        return sum(1 for f, total in zip(free, self._totals, strict=True) if f == total)

    def _next_head(self) -> int | None:
        """The waiter to become head (rule 10e): one that yielded its place, once the waiter
        it yielded to is gone, else the first in queue order; with limits, the first one its
        owner's limit does not hold (None if every waiter is held; rule 11)."""
        resume = self._resume
        if resume is not None:
            if resume not in self._queue:
                self._resume = None
            elif not self._limited or self._hold(resume, self._queue[resume]) is None:
                return resume
        return self._first_eligible() if self._limited else self._first()

    def _yield_head(self, head: Head, now: float) -> Head:
        """``head``, or the first waiter in queue order if ``head`` yields to it (rule 10e):
        only to a waiter of an owner with strictly less usage per share, only while no other
        head has yielded, and only once in a head's wait."""
        if head.ticket == self._resume:
            self._resume = None  # head again: the yield is over
        if (self._resume is not None and self._resume in self._queue) or (
            head.ticket in self._yielded
        ):
            return head
        first = self._first_eligible() if self._limited else self._first()
        if first is None or first == head.ticket:
            return head
        queue, ratio = self._queue, self._usage.ratio
        if ratio(queue[first].owner, now) >= ratio(queue[head.ticket].owner, now):
            return head  # the same owner (a priority), or a tie: the head keeps its place
        self._yielded.add(head.ticket)
        self._resume = head.ticket
        return self._choose_head(first, queue[first], now)

    @staticmethod
    def _keyed(tickets: Iterable[int], rank: int, priority: int) -> Iterator[tuple[int, int, int]]:
        """``tickets`` of one owner and priority as queue-order keys (rule 9)."""
        for ticket in tickets:
            yield rank, priority, ticket

    # ----------------------------------------------------------------- clock and hints
    def _time(self, now: object) -> float:
        """``now`` checked (a finite real number), or the current clock for None."""
        if now is None:
            return self._now
        number = check_real("now", now)
        if not math.isfinite(number):
            raise ValueError(f"now must be finite, got {now!r}")
        return number

    def _commit(self, clock: float) -> float:
        """Advance the clock to ``clock`` (never back); return the time to act at."""
        self._now = max(self._now, clock)
        return self._now

    @staticmethod
    def _check_ticket(ticket: object) -> None:
        if ticket is not None and type(ticket) is not int:
            raise TypeError(f"ticket must be an int or None, got {ticket!r}")
