"""The core's waiting queue at scale: microseconds per task to fill and drain n waiters.

One scheduler over 4 GPUs; a 4-GPU grant holds them all while ``n`` seeded single-GPU demands
(0.1 to 1.0 GPU) queue behind it, then every grant is released in turn until the queue is
empty. Each release walks the queue from its front, from which the granted waiters left: with
the ``dict`` queue of 0.1.x every walk skipped every deleted slot (quadratic), with the
``OrderedDict`` it visits live waiters only. A linear queue costs about the same per task at
every size, so the ratio column (cost per task over the cost at the first size) stays near 1.
Each figure is the best of ``--rounds`` runs (default 3; the machine may be shared).

Run: ``python bench/bench_queue.py`` (about a minute on 2 vCPUs), ``--quick`` for 2k to 8k
once each, ``--sizes 10000,20000``, or ``--dict`` to time the 0.1.x plain-dict queue for comparison.

``--cost`` (issue 23) instead times one release and one cancel with 10k, 100k and 1M waiters
(``--cost-sizes``) of three mixes: ``hinted`` (0.6-GPU waiters, each with an ``expected``
hint), ``distinct`` (every waiter a fractional size of its own) and ``mixed`` (a third each of
hinted 0.6-GPU, distinct fractional and two-GPU waiters). Releases: the four GPUs are held by
whole-GPU grants; each release ends the oldest grant, which grants the next waiters and
backfills behind the head. Cancels: a 4-GPU head waits behind four 0.9-GPU grants, so a
cancel grants nothing but walks the queue; the waiters cancelled are taken from the middle
of the queue. Each figure is the mean of the fastest of eight chunks of the 2000 timed
(``--timed``). Aim: flat (within 2x from 10k to 1M) and under 50 us. ``--cost`` takes a few
minutes and about 2 GB at 1M.
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import random
import time
from collections import deque

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand, Grant, Scheduler

SIZES = (10_000, 50_000, 100_000, 200_000)
QUICK_SIZES = (2_000, 4_000, 8_000)
GPUS = 4
FRACTIONS = (0.1, 0.25, 0.5, 1.0)


def demands(n: int, seed: int = 8) -> list[Demand]:
    """``n`` seeded single-GPU demands."""
    rng = random.Random(seed)
    return [Demand(1, round(rng.choice(FRACTIONS) * UNITS_PER_GPU)) for _ in range(n)]


def drain(queue: list[Demand], plain_dict: bool) -> float:
    """Seconds to queue ``queue`` behind a full pool and release grants until it is empty."""
    core = Scheduler(GPUS)
    if plain_dict:
        core._order.queue = {}  # type: ignore[assignment]
    begin = time.perf_counter()
    _, first = core.submit(Demand(GPUS, UNITS_PER_GPU))
    assert first is not None
    for demand in queue:
        core.submit(demand)
    held: deque[Grant] = deque([first])
    while held:
        grant = held.popleft()
        for gpu in grant.gpus:
            held.extend(core.release(gpu, grant.units))
    elapsed = time.perf_counter() - begin
    assert core.queue_length == 0
    return elapsed


COST_SIZES = (10_000, 100_000, 1_000_000)
MIXES = ("hinted", "distinct", "mixed")
TIMED = 2000  # releases (and cancels) timed per figure
CHUNKS = 8  # timed apart; the best chunk's mean is the figure


def cost_demand(mix: str, i: int, rng: random.Random) -> tuple[Demand, float | None]:
    """The ``i``-th waiter of ``mix`` and its hint: hinted ones are 0.6 GPU (so that a
    release leaves room to backfill into), distinct fractional sizes are above 0.9 GPU (no
    two share a GPU) and distinct from every other waiter's."""
    kind = {"hinted": 0, "distinct": 1}.get(mix, i % 3)
    if kind == 0:
        return Demand(1, UNITS_PER_GPU * 3 // 5), rng.uniform(1.0, 100.0)
    if kind == 1:
        return Demand(1, UNITS_PER_GPU - 1 - i), None
    return Demand(2, UNITS_PER_GPU), None


def release_cost(mix: str, n: int, timed: int = TIMED) -> float:
    """Microseconds per release with ``n`` waiters of ``mix`` behind four full GPUs."""
    rng = random.Random(23)
    core = Scheduler(GPUS)
    held: deque[Grant] = deque()
    for _ in range(GPUS):
        _, grant = core.submit(Demand(1, UNITS_PER_GPU), now=0.0)
        assert grant is not None
        held.append(grant)
    for i in range(n):
        demand, hint = cost_demand(mix, i, rng)
        core.submit(demand, now=0.0, expected=hint)
    now, timed = 1.0, min(timed, n // 4)
    _settle()
    best = math.inf
    for chunk in _chunks(timed):
        begin = time.perf_counter()
        for _ in range(chunk):
            grant = held.popleft()
            now += 0.5
            if len(grant.gpus) == 1:  # the fast path for one GPU, as the fronts take it
                held.extend(core.release(grant.gpus[0], grant.units, ticket=grant.ticket, now=now))
            else:
                held.extend(core.release_many(core.held(grant), ticket=grant.ticket, now=now))
        best = min(best, (time.perf_counter() - begin) / chunk)
    gc.unfreeze()
    return best * 1e6


def _chunks(timed: int) -> list[int]:
    """``timed`` split in up to eight chunks, each timed alone: the figure is the best
    chunk's mean (the machine may be shared; a busy moment spoils one chunk, not all)."""
    count = min(CHUNKS, timed)
    return [timed // count + (1 if i < timed % count else 0) for i in range(count)]


def _settle() -> None:
    """Collect, then move every object made so far out of the collector's sight: the
    waiters were made by the fill, and a full collection over them (which their making
    triggers every so often) is the fill's cost, not a release's or a cancel's."""
    gc.collect()
    gc.freeze()


def cancel_cost(mix: str, n: int, timed: int = TIMED) -> float:
    """Microseconds per cancel from the middle of ``n`` waiters of ``mix`` behind a 4-GPU
    head that waits for four 0.9-GPU grants (nothing is granted)."""
    rng = random.Random(23)
    core = Scheduler(GPUS)
    for _ in range(GPUS):
        core.submit(Demand(1, UNITS_PER_GPU * 9 // 10), now=0.0)
    core.submit(Demand(GPUS, UNITS_PER_GPU), now=0.0)
    tickets = []
    for i in range(n):
        demand, hint = cost_demand(mix, i, rng)
        tickets.append(core.submit(demand, now=0.0, expected=hint)[0])
    timed = min(timed, n // 4)
    middle = tickets[n // 2 - timed // 2 : n // 2 - timed // 2 + timed]
    rng.shuffle(middle)
    _settle()
    best, done = math.inf, 0
    for chunk in _chunks(timed):
        begin = time.perf_counter()
        for ticket in middle[done : done + chunk]:
            core.cancel(ticket, now=1.0)
        best = min(best, (time.perf_counter() - begin) / chunk)
        done += chunk
    gc.unfreeze()
    assert core.queue_length == n + 1 - timed
    return best * 1e6


def cost_table(sizes: tuple[int, ...], timed: int = TIMED) -> str:
    """us per release and per cancel for every mix at every size (``timed`` of each)."""
    ratio = f"{sizes[-1]:,}/{sizes[0]:,}"
    lines = [
        f"core: us per release and per cancel, {GPUS} GPUs, {timed} timed each in {CHUNKS} "
        f"chunks, the fastest chunk's mean "
        f"(Python {platform.python_version()}, {platform.machine()})",
        f"{'':<18}" + "".join(f"{n:>12,}" for n in sizes) + f"{ratio:>20}",
    ]
    for what, cost in (("release", release_cost), ("cancel", cancel_cost)):
        for mix in MIXES:
            figures = [cost(mix, n, timed) for n in sizes]
            cells = "".join(f"{us:>12.1f}" for us in figures)
            lines.append(f"{what + ' ' + mix:<18}{cells}{figures[-1] / figures[0]:>19.2f}x")
    return "\n".join(lines)


def table(sizes: tuple[int, ...], rounds: int, plain_dict: bool) -> str:
    """Time every size and return the table: us per task, and each size over the first."""
    costs = []
    for n in sizes:
        queue = demands(n)
        costs.append(min(drain(queue, plain_dict) for _ in range(rounds)) / n * 1e6)
    kind = "dict (0.1.x)" if plain_dict else "OrderedDict"
    lines = [
        f"core queue ({kind}), fill and drain, {GPUS} GPUs, best of {rounds} "
        f"(Python {platform.python_version()}, {platform.machine()})",
        f"{'tasks':>10}{'us/task':>10}{'ratio':>9}",
    ]
    for n, us in zip(sizes, costs, strict=True):
        lines.append(f"{n:>10,}{us:>10.2f}{us / costs[0]:>8.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its table and return the table text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--sizes", help="comma-separated task counts, e.g. 10000,20000")
    parser.add_argument("--rounds", type=int, help="runs per figure (default 3; 1 with --quick)")
    parser.add_argument("--dict", action="store_true", help="time the 0.1.x plain-dict queue")
    parser.add_argument("--cost", action="store_true", help="us per release and per cancel")
    parser.add_argument("--cost-sizes", help="waiters for --cost, e.g. 10000,100000")
    parser.add_argument("--timed", type=int, default=TIMED, help="releases/cancels timed")
    args = parser.parse_args(argv)
    if args.cost:
        chosen = COST_SIZES
        if args.cost_sizes:
            chosen = tuple(int(size) for size in args.cost_sizes.split(","))
        text = cost_table(chosen, max(1, args.timed))
        print(text)
        return text
    sizes = QUICK_SIZES if args.quick else SIZES
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if args.sizes:
        sizes = tuple(int(size) for size in args.sizes.split(","))
    result = table(sizes, max(1, rounds), args.dict)
    print(result)
    return result


if __name__ == "__main__":
    main()
