"""Where the ``easy`` head waits, and until when (rules 3e, 7e, 12, 13).

The head reserves the GPUs expected to have room for it soonest (hold times learned in
:class:`~hwpool._core._durations.Durations`); estimates are no finer than ``GRAIN`` times its
own expected hold, so GPUs within that of the soonest are a tie, broken by the most free,
then the lowest index. Its shadow is when the chosen GPUs are expected to have room. A
multi-GPU head with groups chooses within one group (rule 12), and never two GPUs of one
memory (rule 13). Rules kept: 3e (the choice and the shadow), 7e (how estimates choose), 12
(within a group), 13 (one GPU per memory).
"""

from __future__ import annotations

from ._books import Books
from ._durations import Durations
from ._requests import Demand, Head, class_of

__all__ = ["GRAIN", "choose_head", "drain"]

GRAIN = 2.0
"""Rule 3e: GPUs expected to have room within this many of the head's expected holds of the
soonest are a tie (estimates are no finer), broken by the most free."""


def choose_head(
    books: Books, durations: Durations, ticket: int, demand: Demand, now: float, *, moved: bool
) -> Head:
    """The GPUs expected to have room for ``demand`` soonest, and when (rule 3e).

    Every GPU expected within ``GRAIN`` times the demand's own expected hold of the soonest
    ones is as good, and among those the most free win, then the lowest index, as in rule 3
    (with nothing known yet, rule 3's choice); several whole GPUs, at most one of each memory
    (rule 13). GPUs too small never qualify. A relative head
    ranks by what is free beyond its need on each GPU, as rule 3 does (for an absolute one
    that is the most free).
    """
    if demand.count > 1 and books.groups is not None:
        return _choose_head_grouped(books, durations, ticket, demand, now, moved=moved)
    free, need = books.free, books.need
    grain = GRAIN * (durations.mean(class_of(demand)) or 0.0)
    timed = _one_per_memory(books, demand, sorted(
        (durations.free_at(gpu, free[gpu], units, now), gpu)
        for gpu in range(books.num_gpus)
        if books.totals[gpu] >= (units := need(demand, gpu))
    ))  # fmt: skip
    cutoff = timed[demand.count - 1][0] + grain
    ranked = sorted(
        (need(demand, gpu) - free[gpu] if demand.relative else -free[gpu], gpu, at)
        for at, gpu in timed
        if at <= cutoff
    )
    chosen = ranked[: demand.count]
    gpus = tuple(sorted(gpu for _, gpu, _ in chosen))
    return Head(ticket, gpus, max(at for _, _, at in chosen), now, moved)


def _choose_head_grouped(
    books: Books, durations: Durations, ticket: int, demand: Demand, now: float, *, moved: bool
) -> Head:
    """:func:`choose_head` for ``count > 1`` whole GPUs within one group (rule 12): the
    group whose ``count``-th GPU is expected to have room soonest (groups within the grain
    of that tie: the most units free on the GPUs it would reserve, then the lowest index),
    and within it rule 3e's choice; at most one GPU of each memory (rule 13)."""
    free, totals, count = books.free, books.totals, demand.count
    grain = GRAIN * (durations.mean(class_of(demand)) or 0.0)
    options: list[tuple[float, list[tuple[float, int]]]] = []
    for members in books.groups or ():
        timed = _one_per_memory(books, demand, sorted(
            (durations.free_at(gpu, free[gpu], totals[gpu], now), gpu) for gpu in members
        ))  # fmt: skip
        if len(timed) >= count:
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


def _one_per_memory(
    books: Books, demand: Demand, timed: list[tuple[float, int]]
) -> list[tuple[float, int]]:
    """``timed`` (GPUs by when they are expected to have room) less, for a demand of several
    whole GPUs, each GPU whose memory an earlier one shares: they can never be granted
    together (rule 13), so the head never reserves two of one memory."""
    if demand.count < 2 or not books.sibling_of:
        return timed
    kept = set(books.one_per_memory(gpu for _, gpu in timed))
    return [(at, gpu) for at, gpu in timed if gpu in kept]


def drain(books: Books, durations: Durations, head: Head, demand: Demand, now: float) -> float:
    """When the head's GPUs are expected to have room for it, as known now."""
    free = books.free
    return max(durations.free_at(gpu, free[gpu], books.need(demand, gpu), now) for gpu in head.gpus)
