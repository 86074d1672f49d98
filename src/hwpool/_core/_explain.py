"""Why each request waits, and when it is expected to start (issue 37).

Pure, like the rest of the core: no clock, no I/O. :func:`explain` answers for every waiting
request of a :class:`~hwpool._core._scheduler.Scheduler` with a :class:`Reason` (modelled on
the reason codes of Slurm's ``squeue``) and an estimated start, the core's own plan of the
future as ``squeue --start`` gives it: a copy of the scheduler is replayed forward, each
running grant ending at its planned end (:func:`planned_end`: its enforced limit, else the
hold time expected of it, hinted or learned, rule 7e), and each waiter's estimate is the
time the copy grants it. One replay gives every waiter's estimate. It is a plan, not a
promise: work that ends sooner or later than expected, and work that arrives meanwhile
(a higher priority, an owner with less usage), move the real start. Where nothing bounds
the wait (a grant it waits for has no limit and no hold time is known, or the replay passes
``max_events``) the estimate is None: unknown.

The scheduler is only read through its public methods, and only its copy is driven: the
caller's scheduler is left exactly as it was.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from .._check import check_int, check_real, check_timeout
from ._capacity import UNITS_PER_GPU
from ._scheduler import Demand, Grant, Scheduler, Waiter

__all__ = [
    "MAX_EVENTS",
    "OUTSIDE_REASONS",
    "Explanation",
    "Reason",
    "Running",
    "explain",
    "planned_end",
]

MAX_EVENTS = 1_000
"""The most grant ends one :func:`explain` replays; waiters not granted by then are unknown.
Each end costs one release (and queue walk) on the copy, so this bounds the work of a status
query on a long queue; the copy itself costs time in proportion to the scheduler's state."""


class Reason(enum.StrEnum):
    """Why a request waits (after Slurm's ``squeue`` reason codes).

    The core gives the first four; the layers above it give the others for what they keep
    from the core (a job held by its user, a server that is draining, a job waiting for
    another), passing them to :func:`explain` as ``outside``.
    """

    PRIORITY = "priority"
    """Behind waiters ahead of it in the queue order (earlier, of higher priority, or of an
    owner with less usage per share): Slurm's ``Priority``."""
    RESOURCES = "resources"
    """First in line (the head, or a waiter holding a reservation), waiting for room: what
    it needs is not free yet. Slurm's ``Resources``."""
    RESERVED = "reserved"
    """What is free now would hold it, but that room is kept for waiters ahead of it (the
    head's reservation, rule 3e, or earlier waiters' under ``reserve-all``), and it cannot
    backfill there without delaying them."""
    OWNER_LIMIT = "owner-limit"
    """Its owner is at one of its limits (rule 11): it waits, held, until the owner's
    running work ends. Slurm's ``AssocGrpGRES`` and kin."""
    HELD = "held"
    """Held by its user or an admin, outside the core (Slurm's ``JobHeldUser``)."""
    DRAINING = "draining"
    """The server or the GPUs it needs are draining: nothing new starts there."""
    DEPENDENCY = "dependency"
    """Waiting for another job to finish first (Slurm's ``Dependency``)."""


OUTSIDE_REASONS = frozenset({Reason.HELD, Reason.DRAINING, Reason.DEPENDENCY})
"""The reasons only the layers above the core know (see :func:`explain`'s ``outside``)."""


class Running(NamedTuple):
    """A grant running now, as its front knows it: the ``grant``, its ``start`` on the
    caller's clock, and the ``demand`` it was granted for (its limit, and its class for the
    learned hold time)."""

    grant: Grant
    start: float
    demand: Demand


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why waiter ``ticket`` waits (``reason``, with a short ``detail`` in words) and when it
    is expected to start (``start``, on the caller's clock; None: unknown)."""

    ticket: int
    reason: Reason
    detail: str
    start: float | None


def planned_end(start: float, hold: float | None, limit: float | None, now: float) -> float | None:
    """When a grant that started at ``start`` is planned to end, never before ``now``.

    ``hold``: the hold time expected of it (a hint, or what the core learned; None: none
    known); ``limit``: the hold time its caller enforces (None: none). It ends at ``start +
    hold``; one already past that is expected to run as long again as it has (at least
    ``hold`` more), as the core's rule 7e expects; a limit ends it by ``start + limit``
    whatever is expected. With neither, None: nothing bounds it.
    """
    if hold is None:
        return None if limit is None else max(now, start + limit)
    end = start + hold
    if end <= now:
        end = now + max(now - start, hold)
    if limit is not None:
        end = min(end, start + limit)
    return max(now, end)


def explain(
    scheduler: Scheduler,
    running: Iterable[Running] = (),
    *,
    now: float | None = None,
    outside: Mapping[int, Reason | tuple[Reason, str]] | None = None,
    hints: Mapping[int, float] | None = None,
    max_events: int = MAX_EVENTS,
    describe: Callable[[int], str] | None = None,
) -> list[Explanation]:
    """Every waiter of ``scheduler`` explained, in queue order, changing nothing.

    ``running``: the grants running now (:class:`Running`), as the caller's books hold them
    (the core keeps no start times a caller can read, and under ``reserve-all`` no hold
    times); capacity held by grants not listed is planned never to come back. ``now``: the
    caller's clock (default and at the earliest: the scheduler's latest). ``outside``:
    waiters the layers above hold for their own reasons (ticket -> one of
    :data:`OUTSIDE_REASONS`, or ``(reason, detail)``): they are explained so, with no
    estimate, and the plan counts them gone. ``hints``: the hold time (seconds) a caller
    expects of a ticket, running or waiting, as ``submit(expected=...)`` gives it; without
    one, the core's learned time (:meth:`Scheduler.expected`). ``max_events``: the most
    grant ends replayed (:data:`MAX_EVENTS`). ``describe``: how to write an amount of units
    in a detail (default: as a share of the largest GPU, ``0.5 GPU``).

    Raises ValueError (or TypeError) naming the argument and the value, changing nothing,
    for a ticket in ``outside`` that is not waiting, a reason there the core gives itself,
    a running ticket listed twice or waiting, a bad hint, ``now`` or ``max_events``, or
    running grants that hold more on a GPU than the scheduler has granted there.
    """
    events = check_int("max_events", max_events, minimum=0)
    clock = scheduler.now if now is None else max(scheduler.now, _check_now(now))
    waiters = list(scheduler.waiters())
    waiting = {waiter.ticket for waiter in waiters}
    held_outside = _check_outside(outside, waiting)
    expected = _check_hints(hints)
    runs = _check_running(scheduler, running, waiting)
    units = describe if describe is not None else _as_share(scheduler.units_per_gpu)
    reasons = _reasons(scheduler, waiters, held_outside, units)
    ends = [
        (end, run.grant)
        for run in runs
        if (end := _end_of(scheduler, run.grant.ticket, run.demand, run.start, expected, clock))
        is not None
    ]
    starts: dict[int, float] = {}
    if ends or held_outside:  # else nothing ends in the plan: every estimate is unknown
        demands = {waiter.ticket: waiter.demand for waiter in waiters}
        plan = copy.deepcopy(scheduler)
        starts = _replay(plan, ends, demands, list(held_outside), expected, clock, events)
    return [
        Explanation(waiter.ticket, *reasons[waiter.ticket], starts.get(waiter.ticket))
        for waiter in waiters
    ]


def _end_of(  # noqa: PLR0917 (the parts of one grant's plan)
    scheduler: Scheduler,
    ticket: int,
    demand: Demand,
    start: float,
    hints: dict[int, float],
    now: float,
) -> float | None:
    """When grant ``ticket`` of ``demand``, started at ``start``, is planned to end: by its
    hint, else by what the scheduler learned of its demand (asked without its owner and
    priority, which never change the answer: asking with an owner would start the core's
    counting of usage, rule 8), and its limit."""
    hold = hints.get(ticket)
    if hold is None:
        hold = scheduler.expected(dataclasses.replace(demand, owner=None, priority=0))
    return planned_end(float(start), hold, demand.limit, now)


# ----------------------------------------------------------------- checks
def _check_now(now: object) -> float:
    number = check_real("now", now)
    if not math.isfinite(number):
        raise ValueError(f"now must be a finite number of seconds, got {now!r}")
    return number


def _check_outside(
    outside: Mapping[int, Reason | tuple[Reason, str]] | None, waiting: set[int]
) -> dict[int, tuple[Reason, str]]:
    if outside is None:
        return {}
    if not isinstance(outside, Mapping):
        raise TypeError(f"outside must be a mapping of ticket to reason, got {outside!r}")
    checked: dict[int, tuple[Reason, str]] = {}
    for ticket, given in outside.items():
        if ticket not in waiting:
            raise ValueError(f"outside names ticket {ticket!r}, which is not waiting")
        reason, detail = given if isinstance(given, tuple) else (given, "")
        if reason not in OUTSIDE_REASONS or not isinstance(detail, str):
            raise ValueError(
                f"outside[{ticket!r}] must be one of "
                f"{', '.join(sorted(r.value for r in OUTSIDE_REASONS))} (with a str detail), "
                f"got {given!r}"
            )
        checked[ticket] = (Reason(reason), detail)
    return checked


def _check_hints(hints: Mapping[int, float] | None) -> dict[int, float]:
    if hints is None:
        return {}
    if not isinstance(hints, Mapping):
        raise TypeError(f"hints must be a mapping of ticket to seconds, got {hints!r}")
    checked: dict[int, float] = {}
    for ticket, hold in hints.items():
        seconds = check_timeout(hold, f"hints[{ticket!r}]")
        if seconds is None:
            raise TypeError(f"hints[{ticket!r}] must be a number of seconds, got None")
        checked[ticket] = seconds
    return checked


def _check_running(plan: Scheduler, running: Iterable[Running], waiting: set[int]) -> list[Running]:
    runs = list(running)
    seen: set[int] = set()
    # Held by grants per GPU (on GPUs sharing memory, at most this: their free is the least
    # of their own and their group's).
    left = [t - f - w for t, f, w in zip(plan.totals, plan.free, plan.withheld, strict=True)]
    for run in runs:
        if not isinstance(run, Running):
            raise TypeError(f"running must hold Running entries, got {run!r}")
        ticket = run.grant.ticket
        if ticket in seen or ticket in waiting:
            raise ValueError(
                f"running lists ticket {ticket!r} "
                f"{'twice' if ticket in seen else 'that is waiting, not running'}"
            )
        seen.add(ticket)
        check_real(f"start of running ticket {ticket!r}", run.start)
        for gpu, units in plan.held(run.grant):
            left[gpu] -= units
            if left[gpu] < 0:
                raise ValueError(
                    f"running grant {ticket} ({run.grant!r}) holds more on GPU {gpu} than "
                    f"the scheduler has granted there"
                )
    return runs


# ----------------------------------------------------------------- reasons
def _reasons(
    plan: Scheduler,
    waiters: list[Waiter],
    outside: dict[int, tuple[Reason, str]],
    units: Callable[[int], str],
) -> dict[int, tuple[Reason, str]]:
    """Each waiter's reason and detail, from the state now (see :class:`Reason`)."""
    keeper = {gpu: ticket for ticket, gpus in plan.reservations().items() for gpu in gpus}
    first: int | None = None  # the first waiter in line: not held, by a limit or outside
    ahead = 0
    reasons: dict[int, tuple[Reason, str]] = {}
    for waiter in waiters:
        ticket, demand = waiter.ticket, waiter.demand
        if ticket in outside:
            reasons[ticket] = outside[ticket]
            continue
        if waiter.held is not None:
            reasons[ticket] = (Reason.OWNER_LIMIT, str(waiter.held).removeprefix("held: "))
            continue
        need = _needs(plan, demand, units)
        if waiter.reserved:
            where = ", ".join(map(str, waiter.reserved))
            reasons[ticket] = (Reason.RESOURCES, f"{need}; reserves GPU {where}")
        elif (fit := _fits_free(plan, demand)) is not None:
            kept = sorted({keeper[gpu] for gpu in fit if gpu in keeper})
            for_whom = f"ticket {', '.join(map(str, kept))}" if kept else "waiters ahead"
            reasons[ticket] = (
                Reason.RESERVED,
                f"{need}; room on GPU {', '.join(map(str, fit))} is kept for {for_whom}",
            )
        elif first is None:
            reasons[ticket] = (Reason.RESOURCES, need)
        else:
            reasons[ticket] = (
                Reason.PRIORITY,
                f"{ahead} waiting ahead (first: ticket {first}); {need}",
            )
        if first is None:
            first = ticket
        ahead += 1
    return reasons


def _as_share(largest: int) -> Callable[[int], str]:
    def share(units: int) -> str:
        return f"{units / largest:.3g} GPU"

    return share


def _need_on(demand: Demand, total: int) -> int:
    """Units ``demand`` (one GPU, not whole) needs on a GPU of ``total`` units (rule 1)."""
    if demand.relative:
        return max(1, -(-demand.units * total // UNITS_PER_GPU))
    return demand.units


def _needs(plan: Scheduler, demand: Demand, units: Callable[[int], str]) -> str:
    """What ``demand`` needs against what is free now, in words."""
    free, totals = plan.free, plan.totals
    whole_one = not demand.relative and demand.units >= max(totals)
    if demand.count > 1 or demand.whole or whole_one:
        idle = sum(1 for gpu, left in enumerate(free) if left >= totals[gpu])
        if demand.count == 1:
            return f"needs a whole GPU; {idle} free now"
        return f"needs {demand.count} whole GPUs; {idle} free now"
    best = max(range(len(free)), key=lambda gpu: (free[gpu] - _need_on(demand, totals[gpu]), -gpu))
    size = units(_need_on(demand, totals[best]))
    return f"needs {size} on one GPU, most free now {units(max(0, free[best]))} (GPU {best})"


def _fits_free(plan: Scheduler, demand: Demand) -> tuple[int, ...] | None:
    """GPUs on which ``demand`` would fit in what is free now, reservations aside (rule 1),
    or None."""
    free, totals = plan.free, plan.totals
    if demand.count == 1 and not demand.whole:
        fits = tuple(g for g, left in enumerate(free) if left >= _need_on(demand, totals[g]))
        return fits or None
    idle = {gpu for gpu, left in enumerate(free) if left >= totals[gpu]}
    for group in plan.groups:
        mine = tuple(gpu for gpu in group if gpu in idle)
        if len(mine) >= demand.count:
            return mine
    return None


# ----------------------------------------------------------------- the plan
def _replay(  # noqa: PLR0917 (the parts of one replay)
    plan: Scheduler,
    ends: list[tuple[float, Grant]],
    demands: dict[int, Demand],
    outside: list[int],
    hints: dict[int, float],
    now: float,
    events: int,
) -> dict[int, float]:
    """Drive ``plan`` (a copy) forward from ``now``, ending each grant at its planned end
    (``ends``: those of the grants running now); the time each waiter of ``demands`` is
    granted. The waiters held ``outside`` are cancelled first: nothing says when they will
    come back."""
    sequence = itertools.count()
    heap = [(end, next(sequence), grant) for end, grant in ends]
    heapq.heapify(heap)
    starts: dict[int, float] = {}
    waiting = len(demands) - len(outside)

    def started(grants: list[Grant], at: float) -> None:
        for grant in grants:
            starts[grant.ticket] = at
            demand = demands[grant.ticket]
            end = _end_of(plan, grant.ticket, demand, at, hints, at)
            if end is not None:
                heapq.heappush(heap, (end, next(sequence), grant))

    for ticket in outside:
        started(plan.cancel(ticket, now=now), now)
    while heap and len(starts) < waiting and events > 0:
        at, _, grant = heapq.heappop(heap)
        events -= 1
        started(plan.release_many(plan.held(grant), ticket=grant.ticket, now=at), at)
    return starts
