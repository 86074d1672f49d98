"""Draining in the server's sans-I/O state: a drained GPU grants nothing new while its leases
run on, the GPU watch's withholding and a drain combine, waiters say why they wait, and a
refused drain changes nothing."""

from __future__ import annotations

import pytest

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._server._drain_file import Drained
from hwpool._server._host_entries import Client, Delivery
from hwpool._server._host_state import HostState
from hwpool._server._host_status import NO_REASON
from hwpool._server._journal import Journal, JournalEntry
from hwpool._wire import _protocol as p
from hwpool._wire._protocol import ErrorCode, ProtocolError

FULL = UNITS_PER_GPU
ADMIN = Client(9, 0, 90, user="root (uid 0)")


def acquire(state: HostState, c: Client, req: int, units: int = FULL) -> list[Delivery]:
    return state.acquire(c, p.Acquire(req, 1, units, True), 0.0)


def granted(deliveries: list[Delivery]) -> list[tuple[int, tuple[int, ...]]]:
    """(req, GPUs) of every grant among ``deliveries``."""
    return [(m.req, m.gpus) for _, m in deliveries if isinstance(m, p.Granted)]


def test_a_drained_gpu_grants_nothing_new_and_its_lease_runs_on() -> None:
    log: list[str] = []
    state = HostState(2, admins={0}, log=log.append)
    a, b = Client(1, 1000, 10), Client(2, 1001, 11)
    assert granted(acquire(state, a, 1)) == [(1, (0,))]
    out = state.drain(ADMIN, p.Drain(5, (0,), "driver update"), 0.0)
    assert out == [(ADMIN, p.Done(5))]
    assert log[-1] == "drain GPU 0 by root (uid 0): driver update"
    assert state.lease(1) is not None  # the lease runs on
    # New work goes to the other GPU; then waits.
    assert granted(acquire(state, b, 1)) == [(1, (1,))]
    assert granted(acquire(state, b, 2)) == []
    # The lease on the drained GPU ends: nothing is granted there.
    assert granted(state.release(a, p.Release(2, 1), 0.0)) == []
    status = state.status(0, 0.0, 0.0)
    assert status.drained_gpus == ((0, "driver update"),)
    assert status.draining is None
    assert status.waiting[0].reason != "draining"  # the core's own reason for one GPU
    # Resuming the GPU grants the waiter there.
    out = state.drain(ADMIN, p.Drain(6, (0,), resume=True), 0.0)
    assert granted(out) == [(2, (0,))]
    assert log[-2:] == ["resume GPU 0 by root (uid 0)", log[-1]]
    assert state.drained == Drained()


def test_the_watch_and_a_drain_withhold_together_and_never_overwrite_each_other() -> None:
    state = HostState(1, admins={0})
    a = Client(1, 1000, 10)
    state.withhold(0, FULL // 4, 0.0)  # memory used outside the queue
    state.drain(ADMIN, p.Drain(1, (0,)), 0.0)
    assert state.core.withheld == (FULL,)
    state.withhold(0, FULL // 2, 0.0)  # the watch's new sample does not end the drain
    assert state.core.withheld == (FULL,)
    assert granted(acquire(state, a, 1, FULL // 4)) == []
    # Resuming withholds what the watch saw last: a half fits, no more.
    out = state.drain(ADMIN, p.Drain(2, (), resume=True), 0.0)
    assert state.core.withheld == (FULL // 2,)
    assert granted(out) == [(1, (0,))]
    assert granted(acquire(state, a, 2, FULL // 2)) == []


def test_a_drained_server_says_every_waiter_waits_for_the_drain() -> None:
    state = HostState(2, admins={0})
    a = Client(1, 1000, 10)
    state.drain(ADMIN, p.Drain(1, (), "driver update"), 0.0)
    assert granted(acquire(state, a, 1)) == []
    assert granted(acquire(state, a, 2, FULL // 2)) == []
    status = state.status(0, 1.0, 0.0)
    assert status.draining == "driver update"
    assert [(w.reason, w.reason_detail, w.estimated_start) for w in status.waiting] == [
        ("draining", "driver update", None)
    ] * 2
    state.drain(ADMIN, p.Drain(2, (), ""), 2.0)  # drained again, with no reason
    assert {w.reason_detail for w in state.status(0, 3.0, 0.0).waiting} == {NO_REASON}


@pytest.mark.parametrize(
    ("actor", "msg", "code", "words"),
    [
        (Client(1, 1000, 10, user="alice"), p.Drain(1, (0,)), ErrorCode.FORBIDDEN, "alice"),
        (ADMIN, p.Drain(1, (0, 2)), ErrorCode.NOT_FOUND, "no GPU 2"),
        (ADMIN, p.Drain(1, (1,), resume=True), ErrorCode.BAD_MESSAGE, "whole server"),
    ],
)
def test_a_refused_drain_changes_nothing(
    actor: Client, msg: p.Drain, code: ErrorCode, words: str
) -> None:
    state = HostState(2, admins={0})
    state.drain(ADMIN, p.Drain(0, (), "before"), 0.0)
    before, withheld = state.drained, state.core.withheld
    with pytest.raises(ProtocolError) as caught:
        state.planned_drain(actor, msg)
    assert caught.value.code is code
    assert words in caught.value.message
    assert (state.drained, state.core.withheld) == (before, withheld)


def test_a_lease_held_before_a_restart_is_reclaimed_on_a_drained_gpu() -> None:
    state = HostState(1, admins={0})
    state.restore_drained(Drained(None, ((0, "repair"),)), 0.0)
    entry = JournalEntry(7, 1000, 10, 1, FULL, ((0, FULL),))
    state.start_recovery(Journal(8, (entry,)), 0.0, 5.0, lambda pid: True)
    a = Client(1, 1000, 10)
    out = state.reclaim(a, p.Reclaim(1, 7, 1, FULL, ((0, FULL),), 1.0), 0.0)
    assert [type(m) for _, m in out] == [p.Granted]
    assert state.core.withheld == (FULL,)  # drained still
    state.reclaimed(a, 0.0)  # recovery over
    assert state.recovery is None
    state.release(a, p.Release(2, 1), 0.0)
    assert granted(acquire(state, a, 3)) == []
    assert granted(state.drain(ADMIN, p.Drain(4, (0,), resume=True), 0.0)) == [(3, (0,))]
