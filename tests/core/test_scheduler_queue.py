"""The waiting queue drains in linear time and keeps the schedule a plain dict gave (issue 8).

The quadratic cost of the old ``dict`` queue lived inside CPython's iteration (it skipped every
deleted slot), which no Python-level counter sees; so the test pins what the fix relies on
(the queue is an ``OrderedDict``, whose iteration follows live entries only) and that the
schedule is the one the dict queue produced. ``bench/bench_queue.py`` measures the scaling.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from hwpool._core._scheduler import Demand, Grant, Scheduler

U = 1_000


def drain(core: Scheduler, seed: int, n: int) -> list[tuple[int, tuple[int, ...], int]]:
    """Queue ``n`` seeded demands behind a full pool, then release one grant at a time."""
    rng = random.Random(seed)
    held: list[Grant] = []
    _, first = core.submit(Demand(core.num_gpus, U))
    assert first is not None
    held.append(first)
    for _ in range(n):
        if rng.random() < 0.2:
            demand = Demand(rng.randint(2, core.num_gpus), U)
        else:
            demand = Demand(1, rng.choice((100, 250, 500, 1000)))
        _, grant = core.submit(demand)
        assert grant is None
    log: list[tuple[int, tuple[int, ...], int]] = []
    while held:
        grant = held.pop(0)
        for gpu in grant.gpus:
            new = core.release(gpu, grant.units)
            log.extend((g.ticket, g.gpus, g.units) for g in new)
            held.extend(new)
    assert core.queue_length == 0
    return log


def test_queue_is_ordered_dict() -> None:
    assert type(Scheduler(2, U, policy="reserve-all")._order.queue) is OrderedDict


def test_schedule_matches_a_plain_dict_queue() -> None:
    for seed in range(3):
        fixed = Scheduler(4, U, policy="reserve-all")
        old = Scheduler(4, U, policy="reserve-all")
        old._order.queue = {}  # type: ignore[assignment]  # the queue before the fix
        assert drain(fixed, seed, 3_000) == drain(old, seed, 3_000)
