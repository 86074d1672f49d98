"""Every wait explained, with an estimated start (issue 37): :mod:`hwpool._core._explain`.

Each reason comes from a real scheduler state; the estimates are worked by hand on small
cases with enforced limits and learned hold times; what nothing bounds is unknown; bad input
is refused naming the value; and an explanation changes nothing in the scheduler.
"""

from __future__ import annotations

from typing import Any

import pytest

from hwpool._cli._jobs_waits import DEPENDENCY, HELD
from hwpool._core._explain import (
    OUTSIDE_REASONS,
    Explanation,
    Reason,
    Running,
    explain,
    planned_end,
)
from hwpool._core._limits import OwnerLimits
from hwpool._core._scheduler import POLICIES, Demand, Scheduler

U = 100


def _run(core: Scheduler, demand: Demand, now: float) -> Running:
    """Submit ``demand`` at ``now``; it must be granted at once."""
    _, grant = core.submit(demand, now=now)
    assert grant is not None
    return Running(grant, now, demand)


def _by_ticket(found: list[Explanation]) -> dict[int, Explanation]:
    return {e.ticket: e for e in found}


def _state(core: Scheduler, owners: tuple[Any, ...] = (None, "a", "b")) -> tuple[Any, ...]:
    """What the core answers: an explanation must leave every answer as it was."""
    return (
        core.free,
        core.now,
        core.queue_length,
        [(w.ticket, w.demand, w.reserved, w.held) for w in core.waiters()],
        core.reservations(),
        core.head,
        core.expected(Demand(1, U)),
        [(core.running(o), core.usage(o)) for o in owners],
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_the_first_in_line_waits_for_resources_and_those_behind_it_for_priority(
    policy: str,
) -> None:
    core = Scheduler(2, U, policy=policy)
    runs = [_run(core, Demand(1, U, limit=10.0), 0.0), _run(core, Demand(1, U, limit=20.0), 0.0)]
    first, _ = core.submit(Demand(1, U, limit=5.0), now=1.0)
    second, _ = core.submit(Demand(2, U, limit=4.0), now=1.0)
    found = _by_ticket(explain(core, runs, now=2.0))
    assert found[first].reason is Reason.RESOURCES
    assert "needs a whole GPU; 0 free now" in found[first].detail
    assert found[second].reason is Reason.PRIORITY
    assert f"first: ticket {first}" in found[second].detail
    assert "needs 2 whole GPUs; 0 free now" in found[second].detail
    # By hand: GPU 0 frees at 10, the first runs 10-15; GPU 1 frees at 20, so both at 20.
    assert found[first].start == 10.0
    assert found[second].start == 20.0


def test_a_waiter_that_fits_in_the_room_kept_for_the_head_waits_reserved() -> None:
    core = Scheduler(2, U)
    runs = [_run(core, Demand(1, U, limit=10.0), 0.0), _run(core, Demand(1, 50, limit=10.0), 0.0)]
    head, _ = core.submit(Demand(1, U), now=1.0)
    assert core.head is not None and core.head.gpus == (1,)  # a tie at 10: the most free
    small, _ = core.submit(Demand(1, 50), now=1.0)  # fits in GPU 1's 50, no limit: no backfill
    found = _by_ticket(explain(core, runs))
    assert found[head].reason is Reason.RESOURCES
    assert found[small].reason is Reason.RESERVED
    assert found[small].detail.startswith("needs 0.5 GPU on one GPU, most free now 0.5 GPU (GPU 1)")
    assert found[small].detail.endswith(f"room on GPU 1 is kept for ticket {head}")
    # At 10 GPU 0 frees (the head takes it), then GPU 1's 50 free room takes the small one.
    assert found[head].start == 10.0
    assert found[small].start == 10.0


@pytest.mark.parametrize("policy", POLICIES)
def test_a_waiter_over_its_owners_limit_waits_owner_limit_until_its_grant_ends(
    policy: str,
) -> None:
    core = Scheduler(2, U, policy=policy, limits={"a": OwnerLimits(running=1)})
    runs = [_run(core, Demand(1, U, owner="a", limit=7.0), 0.0)]
    held, _ = core.submit(Demand(1, U, owner="a", limit=3.0), now=0.0)
    assert core.free == (0, U)  # room enough: only the limit holds it
    found = _by_ticket(explain(core, runs, now=1.0))
    assert found[held].reason is Reason.OWNER_LIMIT
    assert "'a'" in found[held].detail and "1 running grant" in found[held].detail
    assert found[held].start == 7.0


@pytest.mark.parametrize("reason", sorted(OUTSIDE_REASONS))
def test_a_waiter_held_outside_the_core_has_that_reason_no_estimate_and_is_planned_gone(
    reason: Reason,
) -> None:
    core = Scheduler(1, U)
    runs = [_run(core, Demand(1, U, limit=4.0), 0.0)]
    kept, _ = core.submit(Demand(1, U, limit=6.0), now=0.0)
    behind, _ = core.submit(Demand(1, U, limit=1.0), now=0.0)
    found = _by_ticket(explain(core, runs, outside={kept: (reason, "by its user")}))
    assert (found[kept].reason, found[kept].detail, found[kept].start) == (
        reason,
        "by its user",
        None,
    )
    assert found[behind].start == 4.0  # not 10: the held one is not planned to run
    plain = _by_ticket(explain(core, runs))
    # Planned to run after it: granted at 4, it is expected to hold the 4 s the plan has
    # then learned (its limit of 6 not reached), so the one behind starts at 8.
    assert plain[behind].start == 8.0


def test_an_estimate_is_unknown_where_a_grant_it_waits_for_has_no_limit_and_nothing_is_learned():
    core = Scheduler(2, U)
    runs = [_run(core, Demand(1, U), 0.0), _run(core, Demand(1, U, limit=8.0), 0.0)]
    whole, _ = core.submit(Demand(2, U), now=1.0)
    one, _ = core.submit(Demand(1, U, limit=2.0), now=1.0)
    found = _by_ticket(explain(core, runs))
    assert found[whole].start is None  # needs GPU 0, whose grant nothing bounds
    assert found[one].start is None  # behind it in line (EASY: never passes the head)
    assert explain(core, runs, hints={runs[0].grant.ticket: 3.0})[0].start == 8.0


def test_learned_hold_times_bound_a_grant_without_a_limit() -> None:
    core = Scheduler(1, U)
    _, grant = core.submit(Demand(1, U), now=0.0)
    assert grant is not None
    core.release_granted(grant, now=4.0)  # learned: this demand holds 4 s
    assert core.expected(Demand(1, U)) == 4.0
    runs = [_run(core, Demand(1, U), 10.0)]
    waiter, _ = core.submit(Demand(1, U), now=11.0)
    assert explain(core, runs, now=11.0)[0].start == 14.0
    # Past its expected end, a grant is expected to run as long again as it has.
    assert explain(core, runs, now=16.0)[0].start == 22.0
    # A hint for the running grant replaces what was learned.
    assert explain(core, runs, now=11.0, hints={runs[0].grant.ticket: 2.0})[0].start == 12.0
    assert explain(core, runs, now=11.0)[0].ticket == waiter


def test_max_events_bounds_the_replay_and_what_it_does_not_reach_is_unknown() -> None:
    core = Scheduler(1, U)
    runs = [_run(core, Demand(1, U, limit=1.0), 0.0)]
    tickets = [core.submit(Demand(1, U, limit=1.0), now=0.0)[0] for _ in range(3)]
    assert [e.start for e in explain(core, runs)] == [1.0, 2.0, 3.0]
    assert [e.start for e in explain(core, runs, max_events=2)] == [1.0, 2.0, None]
    assert [e.start for e in explain(core, runs, max_events=0)] == [None, None, None]
    assert [e.ticket for e in explain(core, runs)] == tickets


@pytest.mark.parametrize(
    ("start", "hold", "limit", "now", "end"),
    [
        (0.0, None, None, 5.0, None),
        (0.0, None, 8.0, 5.0, 8.0),
        (0.0, None, 8.0, 9.0, 9.0),  # past its limit: ends now
        (0.0, 3.0, None, 1.0, 3.0),
        (0.0, 3.0, None, 5.0, 10.0),  # past its hold: as long again as it has run
        (0.0, 3.0, 7.0, 5.0, 7.0),  # ... but never past its limit
        (2.0, 10.0, 4.0, 3.0, 6.0),
    ],
)
def test_planned_end(
    start: float, hold: float | None, limit: float | None, now: float, end: float | None
) -> None:
    assert planned_end(start, hold, limit, now) == end


@pytest.mark.parametrize("policy", POLICIES)
def test_an_explanation_changes_nothing_in_the_scheduler(policy: str) -> None:
    core = Scheduler(
        [U, U, 2 * U], policy=policy, limits={"a": OwnerLimits(gpus=1)}, shares={"b": 2.0}
    )
    runs = [
        _run(core, Demand(1, 2 * U, owner="a", limit=9.0), 0.0),
        _run(core, Demand(1, U, owner="b"), 0.5),
    ]
    for owner, units in (("a", U), ("b", 2 * U), ("b", 50), (None, U), ("a", 30)):
        core.submit(Demand(1, units, owner=owner), now=1.0)
    before = _state(core)
    found = explain(core, runs, now=3.0, hints={runs[1].grant.ticket: 2.0})
    assert {e.reason for e in found} >= {Reason.OWNER_LIMIT}
    assert all(e.start is None or e.start >= 3.0 for e in found)
    assert _state(core) == before


def test_bad_input_is_refused_naming_the_value_and_changes_nothing() -> None:
    core = Scheduler(1, U)
    runs = [_run(core, Demand(1, U, limit=4.0), 0.0)]
    waiter, _ = core.submit(Demand(1, U), now=0.0)
    before = _state(core)
    with pytest.raises(ValueError, match="outside names ticket 999, which is not waiting"):
        explain(core, runs, outside={999: Reason.HELD})
    with pytest.raises(ValueError, match=r"outside\[2\] must be one of .*'resources'"):
        explain(core, runs, outside={waiter: Reason.RESOURCES})
    with pytest.raises(ValueError, match="running lists ticket 1 twice"):
        explain(core, [runs[0], runs[0]])
    with pytest.raises(ValueError, match=f"running lists ticket {waiter} that is waiting"):
        explain(core, [runs[0]._replace(grant=runs[0].grant._replace(ticket=waiter))])
    with pytest.raises(ValueError, match="max_events"):
        explain(core, runs, max_events=-1)
    with pytest.raises(ValueError, match="now must be a finite number of seconds, got inf"):
        explain(core, runs, now=float("inf"))
    with pytest.raises(ValueError, match=r"hints\[1\]"):
        explain(core, runs, hints={1: -2.0})
    fake = runs[0]._replace(grant=runs[0].grant._replace(ticket=77, units=U))
    with pytest.raises(ValueError, match=r"running grant 77 .* holds more on GPU 0 than"):
        explain(core, [runs[0], fake])
    assert _state(core) == before


def test_the_jobs_layer_names_its_reasons_as_the_core_does() -> None:
    """``hwpool jobs`` spells held and dependency itself (so as not to load the core)."""
    assert (Reason.HELD.value, Reason.DEPENDENCY.value) == (HELD, DEPENDENCY)
