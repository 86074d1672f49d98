"""The core's cheap paths decide exactly as its checked ones (issue 25).

``Durations`` learns a hold time by appending it to a list and brings the averages up to
date only when an estimate is asked for (or the list grows long): the means are those of
learning each at its release. ``Scheduler.release_granted`` (the in-process backend's
release, which checks nothing) frees and grants exactly as ``release``/``release_many``. A
demand admitted once is remembered by identity: passing the same object again, or an equal
new one, decides alike.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwpool._core._durations import _FOLD_AT, SMOOTHING, Durations
from hwpool._core._scheduler import Demand, Grant, Scheduler

U = 1_000


def eager_means(holds: list[tuple[str, float]]) -> tuple[dict[str, float], float]:
    """Each class's smoothed mean and the mean over all, learned one release at a time."""
    means: dict[str, float] = {}
    for key, seconds in holds:
        mean = means.get(key)
        means[key] = seconds if mean is None else mean + SMOOTHING * (seconds - mean)
    return means, sum(s for _, s in holds) / len(holds)


@pytest.mark.parametrize("grants", [1, 7, _FOLD_AT, _FOLD_AT + 1, 3 * _FOLD_AT + 5])
def test_hold_times_learned_lazily_are_those_learned_at_each_release(grants: int) -> None:
    rng = random.Random(grants)
    durations = Durations(2)
    holds: list[tuple[str, float]] = []
    for ticket in range(1, grants + 1):
        key, start, seconds = rng.choice("abc"), rng.uniform(0, 100), rng.uniform(0, 10)
        durations.start(ticket, key, {ticket % 2: 10}, now=start)
        durations.finish(ticket, ticket % 2, 10, now=start + seconds)
        holds.append((key, start + seconds - start))
    means, overall = eager_means(holds)
    for key in "abc":
        assert durations.mean(key) == means.get(key, overall)
    assert durations.mean() == overall


def test_a_release_with_no_ticket_is_learned_from_as_before() -> None:
    durations = Durations(1)
    durations.start(1, "a", {0: 10}, now=0.0)
    durations.finish(None, 0, 10, now=4.0)  # guessed: nothing learned
    assert durations.mean("a") is None
    durations.start(2, "a", {0: 10}, now=4.0)
    durations.finish(2, 0, 4, now=5.0)  # a part: learned only once all is back
    assert durations.mean("a") is None
    durations.finish(2, 0, 6, now=6.0)
    assert durations.mean("a") == 2.0


DEMANDS = [Demand(1, U // 10), Demand(1, U // 4), Demand(1, U // 2), Demand(1, U), Demand(2, U)]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    policy=st.sampled_from(["easy", "reserve-all"]),
    backfill=st.sampled_from(["limits", "estimates"]),
    totals=st.sampled_from([[U] * 4, [U, U, U // 2, U // 2]]),
)
def test_release_granted_decides_as_release(
    seed: int, policy: str, backfill: str, totals: list[int]
) -> None:
    """Two cores driven alike, one releasing GPU by GPU with checks, one with
    ``release_granted`` (the same demand objects for one, equal new ones for the other)."""
    rng = random.Random(seed)
    checked = Scheduler(totals, policy=policy, backfill=backfill)
    fast = Scheduler(totals, policy=policy, backfill=backfill)
    held: dict[int, Grant] = {}
    waiting: set[int] = set()
    now = 0.0
    for _ in range(120):
        now += rng.choice([0.0, 0.01, 0.5, 2.0])
        if rng.random() < 0.55 or not (held or waiting):
            demand = rng.choice(DEMANDS)
            equal = Demand(demand.count, demand.units, demand.whole)
            if rng.random() < 0.5:
                ticket, grant = checked.submit(equal, now=now)
                assert fast.submit(demand, now=now) == (ticket, grant)
                if grant is None:
                    waiting.add(ticket)
                else:
                    held[ticket] = grant
            else:
                grant = checked.grant_now(equal, now=now)
                assert fast.grant_now(demand, now=now) == grant
                if grant is not None:
                    held[grant.ticket] = grant
            continue
        if held and rng.random() < 0.8:
            grant = held.pop(rng.choice(sorted(held)))
            parts = checked.held(grant)
            if len(parts) == 1:
                gpu, units = parts[0]
                granted = checked.release(gpu, units, ticket=grant.ticket, now=now)
            else:
                granted = checked.release_many(parts, ticket=grant.ticket, now=now)
            assert fast.release_granted(grant, now) == granted
        elif waiting:
            ticket = rng.choice(sorted(waiting))
            waiting.discard(ticket)
            granted = checked.cancel(ticket, now=now)
            assert fast.cancel(ticket, now=now) == granted
        else:
            continue
        for grant in granted:
            waiting.discard(grant.ticket)
            held[grant.ticket] = grant
        assert fast.free == checked.free and fast.head == checked.head
        assert fast.reservations() == checked.reservations()
