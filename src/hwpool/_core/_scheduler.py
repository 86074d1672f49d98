"""The GPU scheduling core's face: a pure, synchronous state machine (no I/O, no clock, no
threads) that every front drives.

Every front (asyncio, blocking threads, the virtual-time simulator, the host server) drives
this one :class:`Scheduler` and turns the grants it returns into woken waiters. Time enters
only as the ``now`` argument of each input, from the caller's clock. The rules it keeps are
numbered in docs/scheduling.md ("The core's rules"); the face checks arguments and keeps
the clock, and its parts decide:

- the books (:mod:`~hwpool._core._books`): totals, free, withheld, groups, tickets;
- admission (:mod:`~hwpool._core._admission`, :mod:`~hwpool._core._holds`): what may be
  asked, and what owner limits refuse or hold;
- order (:mod:`~hwpool._core._order`): the queue, owners, usage and fair share;
- placement (:mod:`~hwpool._core._placement`): best fit and reservation choices;
- the policy (:mod:`~hwpool._core._policy`): ``easy`` (:mod:`~hwpool._core._easy`),
  ``reserve-all`` (:mod:`~hwpool._core._reserve_all`), or one of the simulator's baselines
  (:mod:`~hwpool._core._fifo`, :mod:`~hwpool._core._first_fit`), which plans over the parts.

Invariants after every call: per GPU ``0 <= free <= total``; a ticket is waiting, granted or
gone, never two; reservations are disjoint and held only by waiters; with groups, every
grant and reservation of more than one GPU lies within one group; with memory groups, the
units held on a group's GPUs together are at most its capacity.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import ClassVar

from .._check import check_int, check_timeout
from ._admission import Admission
from ._books import Books, check_totals
from ._capacity import UNITS_PER_GPU
from ._durations import Durations
from ._fairshare import DEFAULT_HALF_LIFE, Usage, check_half_life, check_shares
from ._holds import OwnerHolds
from ._limits import LimitHold, OwnerLimits, check_limits
from ._order import QueueOrder
from ._placement import Placement
from ._policies import BACKFILLS, POLICIES
from ._policy import Parts, policy_class
from ._recovery import Recovery
from ._requests import UNSEEN, Demand, Grant, Head, Waiter, class_of
from ._shared import SharedFree

__all__ = ["BACKFILLS", "POLICIES", "Demand", "Grant", "Head", "Scheduler", "Waiter"]


class Scheduler:
    """The best-fit, backfilling GPU scheduler with a queue in fair-share order.

    ``submit`` and ``grant_now`` take new requests, ``release`` and ``cancel`` report what
    finished or gave up; each returns the grants it made so the caller can wake those waiters.
    Demands come validated from the fronts (GPUPool, the trace reader); a bad release or
    cancel raises ValueError or KeyError and leaves the state unchanged. No call is atomic
    under an exception raised inside it (KeyboardInterrupt from a signal handler, MemoryError):
    a front that sees one rebuilds the core from its own books with :meth:`rebuild`.
    """

    offered: ClassVar[tuple[str, ...]] = POLICIES
    """The policies this face may be built with (the simulator's baselines are offered by
    a subclass of its own)."""

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
        ``policy``: one of :attr:`offered` (see docs/scheduling.md). ``shares``: owner ->
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
        if policy not in self.offered:
            raise ValueError(f"policy must be one of {', '.join(self.offered)}; got {policy!r}")
        if not isinstance(backfill, str) or backfill not in BACKFILLS:
            raise ValueError(f"backfill must be one of {', '.join(BACKFILLS)}; got {backfill!r}")
        totals = check_totals(gpus, units_per_gpu, UNITS_PER_GPU)
        books = self._books = Books(totals, groups, memory_groups)
        self.num_gpus = books.num_gpus
        self.units_per_gpu = books.units_per_gpu
        self.policy = policy
        self.backfill = backfill
        usage = Usage(totals, checked_shares, checked_half_life)
        # Under easy each grant's one record is its hold-time run, which reports to usage.
        self._durations = Durations(self.num_gpus, usage)
        holds = self._holds = OwnerHolds(books, usage, checked_limits, checked_default)
        self._limited = holds.active
        made = policy_class(policy)
        # Usage is counted from the start unless the policy may count it lazily (rule 8);
        # limits read what owners hold.
        counting = not made.lazy_usage or holds.active
        order = self._order = QueueOrder(books, usage, self._durations, holds, counting)
        holds.order = order
        self._admission = Admission(books, holds, order)
        # The fast path (GPUs of one size, no limits, one group); else the plain walk.
        fast = books.uniform and not holds.active and books.groups is None
        parts = Parts(
            books=books,
            order=order,
            holds=holds,
            admission=self._admission,
            placement=Placement(books),
            durations=self._durations,
            estimates=backfill == "estimates",
            fast=fast and books.shared is None,
        )
        self._policy = made(parts)
        holds.reserving = self._policy.reserving
        self._recovery = Recovery(parts, self._policy)
        # The demand last admitted, as given and as admitted (see _admit_anew).
        self._admitted: tuple[Demand, Demand] = (UNSEEN, UNSEEN)
        self._bind()

    def _bind(self) -> None:
        """Keep direct references to what the hot path reads (anew after a rebuild)."""
        self._free = self._books.free
        self._totals = self._books.totals
        self._shared = self._books.shared
        self._walk = self._policy.walk
        self._finish = self._policy.finish
        self._grant_now = self._policy.grant_now

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
        groups = self._books.groups
        return groups if groups is not None else (tuple(range(self.num_gpus)),)

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
        return self._books.held(grant)

    @property
    def queue_length(self) -> int:
        """How many requests are waiting."""
        return len(self._order.queue)

    def is_waiting(self, ticket: int) -> bool:
        """Whether ``ticket`` is in the queue."""
        return ticket in self._order.queue

    def waiters(self) -> Iterator[Waiter]:
        """The waiting requests in queue order (rule 9, as of the latest ``now``), with their
        current reservations."""
        reserved = self._policy.reservations()
        for ticket, demand in list(self._order.in_order()):
            mine = reserved.get(ticket, ())
            held = self._holds.hold(ticket, demand) if self._limited and not mine else None
            yield Waiter(ticket, demand, mine, held)

    def held_by_limit(self, ticket: int) -> LimitHold | None:
        """Why waiter ``ticket`` is held by its owner's limit (rule 11), or None if it is
        not; KeyError if ``ticket`` is not waiting."""
        demand = self._order.queue[ticket]
        if not self._limited or ticket in self.reservations():
            return None
        return self._holds.hold(ticket, demand)

    def limits(self, owner: Hashable) -> OwnerLimits | None:
        """``owner``'s limits (rule 11), or None if it has none."""
        return self._holds.limits_of(owner)

    def usage(self, owner: Hashable, now: float | None = None) -> float:
        """``owner``'s recent usage in GPU-seconds, decayed with the half-life (rule 8), at
        ``now`` (default, and at the earliest: the latest time given); 0 for an owner never
        granted."""
        at = max(self._books.now, self._books.time(now))
        self._order.count_usage()
        return self._order.usage.usage(owner, at)

    def running(self, owner: Hashable) -> float:
        """GPUs ``owner`` holds now (a fraction counts its share of its GPU)."""
        self._order.count_usage()
        return self._order.usage.running(owner)

    def share(self, owner: Hashable) -> float:
        """``owner``'s share (1 unless the scheduler's ``shares`` name it)."""
        return self._order.usage.share(owner)

    @property
    def half_life(self) -> float:
        """Seconds over which usage counts half (rule 8)."""
        return self._order.usage.half_life

    def reservations(self) -> dict[int, tuple[int, ...]]:
        """Reserved GPUs per waiting ticket (waiters that reserve nothing are absent)."""
        return self._policy.reservations()

    @property
    def head(self) -> Head | None:
        """Under ``easy``, the head of the queue with its GPUs and shadow; else None."""
        return self._policy.head

    @property
    def now(self) -> float:
        """The latest time any input gave (the clock never goes back); 0 before any."""
        return self._books.now

    def expected(self, demand: Demand) -> float | None:
        """The hold time in seconds the core would assume for ``demand`` without a hint (the
        smoothed mean of its demand's, else of all, hold times), or None before any is known."""
        return self._durations.guess(class_of(self._admission.admit(demand)))

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
        books = self._books
        clock = now if type(now) is float and now - now == 0.0 else books.time(now)
        hint = None if expected is None else check_timeout(expected, "expected")
        if self._limited:
            self._admission.refuse_beyond(demand, None)
        at = books.now
        if clock > at:
            books.now = at = clock
        return self._grant_now(demand, at, hint)

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
        books = self._books
        clock = now if type(now) is float and now - now == 0.0 else books.time(now)
        if expected is not None:
            expected = check_timeout(expected, "expected")
        if self._limited:
            at, hint = max(books.now, clock), expected
            self._admission.refuse_beyond(demand, lambda: self._policy.would_wait(demand, at, hint))
        return self._policy.submit(demand, books.commit(clock), expected)

    def release(
        self, gpu: int, units: int, *, ticket: int | None = None, now: float | None = None
    ) -> list[Grant]:
        """Give back ``units`` on ``gpu``; return the waiters granted as a result.

        ``ticket``: the grant they belong to, so that ``easy`` learns its hold time (without
        it the core guesses which grant ended, and learns nothing); ``now``: as in
        :meth:`submit`.
        """
        free, books = self._free, self._books
        if not (
            type(gpu) is int
            and 0 <= gpu < self.num_gpus
            and type(units) is int
            and 0 < units <= self._totals[gpu] - free[gpu]
            and self._shared is None
        ):  # the checks again, slowly, for the error message (and NumPy ints made ints)
            gpu = books.check_gpu(gpu)
            units = books.check_release(gpu, units)
        clock = now if type(now) is float and now - now == 0.0 else books.time(now)
        if ticket is not None and type(ticket) is not int:
            books.check_ticket(ticket)
        at = books.now
        if clock > at:
            books.now = at = clock
        free[gpu] += units
        self._finish(ticket, gpu, units, at)
        return self._walk(at) if self._order.queue else []

    def release_granted(self, grant: Grant, now: float | None = None) -> list[Grant]:
        """Give back all of ``grant``, a grant of this core that its caller's own books show
        held (and hand back once): :meth:`release` of each GPU without checking the
        arguments against the state, for a caller that keeps such books (the in-process
        backend, on every release). ``now``: as in :meth:`release`; the waiters granted as a
        result are returned."""
        gpus, units = grant.gpus, grant.units
        if len(gpus) != 1 or not units:  # several GPUs, or whole ones of mixed sizes
            return self.release_many(self.held(grant), ticket=grant.ticket, now=now)
        books = self._books
        clock = now if type(now) is float and now - now == 0.0 else books.time(now)
        at = books.now
        if clock > at:
            books.now = at = clock
        gpu = gpus[0]
        self._free[gpu] += units
        self._finish(grant.ticket, gpu, units, at)
        return self._walk(at) if self._order.queue else []

    def release_many(
        self,
        releases: Iterable[tuple[int, int]],
        *,
        ticket: int | None = None,
        now: float | None = None,
    ) -> list[Grant]:
        """Give back several ``(gpu, units)`` at once (all or nothing), then walk the queue
        once; ``ticket`` and ``now`` as in :meth:`release`."""
        books = self._books
        pending: dict[int, int] = {}
        for raw_gpu, raw_units in releases:
            gpu = books.check_gpu(raw_gpu)
            units = books.check_units(raw_units)
            pending[gpu] = pending.get(gpu, 0) + units
        for gpu, units in pending.items():
            books.check_release(gpu, units)
        clock = books.time(now)
        books.check_ticket(ticket)
        at = books.commit(clock)
        for gpu, units in pending.items():
            self._free[gpu] += units
            self._finish(ticket, gpu, units, at)
        return self._walk(at) if self._order.queue else []

    def cancel(self, ticket: int, *, now: float | None = None) -> list[Grant]:
        """Withdraw a waiting request; return the waiters granted as a result.

        Raises KeyError if ``ticket`` is not waiting (it was granted, or never existed).
        """
        clock = self._books.time(now)
        if ticket not in self._order.queue:
            raise KeyError(ticket)
        return self._policy.cancel(ticket, self._books.commit(clock))

    def _admit_anew(self, demand: Demand) -> Demand:
        """Admission's check, remembered for the next call with this very demand: a front
        passes the same (frozen) Demand object for the same request, and admitting it
        depends on nothing that changes (its one side effect, counting usage from then on,
        is done once for all)."""
        admitted = self._admission.admit(demand)
        self._admitted = (demand, admitted)  # one store: never half updated
        return admitted

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
        books = self._books
        gpu = books.check_gpu(gpu)
        units = check_int("units to withhold", units, minimum=0, maximum=self._totals[gpu])
        clock = books.time(now)
        before = books.withheld[gpu]
        if units == before:
            return []
        at = books.commit(clock)
        books.withheld[gpu] = units
        self._free[gpu] -= units - before
        return self._walk(at) if self._order.queue else []

    @property
    def withheld(self) -> tuple[int, ...]:
        """Units withheld per GPU (:meth:`withhold`); all 0 unless the caller withheld some."""
        return tuple(self._books.withheld)

    # ----------------------------------------------------------------- recovery
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
        return self._recovery.restore(gpus, units, now, owner, since)

    def check_restore(self, owner: Hashable, held: Mapping[int, int]) -> None:
        """LimitExceeded, changing nothing, where taking back a grant holding ``held`` (GPU ->
        units) would take ``owner`` past its ``gpus``, ``running`` or ``units`` limit (rule
        11), whatever its mode: a grant that is held already cannot wait. What a grant held
        before a restart goes through, as a new request goes through :meth:`submit`'s."""
        self._admission.check_restore(owner, held)

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
        try:
            return self._recovery.rebuild(held, waiting, now)
        finally:
            self._bind()  # the books' free units are a new list once it started over
