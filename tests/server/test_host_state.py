"""The server's sans-I/O bookkeeping: owners, deliveries, cancel rights, recovery, journal."""

from __future__ import annotations

import pytest

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._limits import OwnerLimits
from hwpool._core._scheduler import Demand
from hwpool._server._host_entries import ID_BLOCK, Client, Delivery
from hwpool._server._host_state import HostState
from hwpool._server._journal import Journal, JournalEntry
from hwpool._wire import _protocol as p
from hwpool._wire._protocol import ErrorCode, ProtocolError

FULL = UNITS_PER_GPU
HALF = FULL // 2


def host(num_gpus: int = 2) -> HostState:
    return HostState(num_gpus, admins={0, 500})


def client(uid: int = 1000, pid: int = 10, number: int = 1) -> Client:
    return Client(number, uid, pid)


def acquire(
    state: HostState, c: Client, req: int, fraction: float = 1.0, *, count: int = 1,
    wait: bool = True,
) -> list[Delivery]:  # fmt: skip
    return state.acquire(c, p.Acquire(req, count, round(fraction * FULL), wait), 0.0)


def only(deliveries: list[Delivery]) -> p.ServerMessage:
    assert len(deliveries) == 1, deliveries
    return deliveries[0][1]


def granted_id(deliveries: list[Delivery]) -> int:
    message = deliveries[0][1]
    assert isinstance(message, p.Granted)
    return message.id


# ----------------------------------------------------------------- granting and owners
def test_grant_at_once_then_queue_then_push_to_the_waiter() -> None:
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    assert only(acquire(state, a, 1)) == p.Granted(1, 1, (0,), FULL)
    assert only(acquire(state, b, 7, 0.5)) == p.Queued(7, 2)
    out = state.release(a, p.Release(2, 1), 1.0)
    assert out == [(b, p.Granted(7, 2, (0,), HALF))]  # a release is not answered
    assert state.core.free == (HALF,)


def test_reservations_keep_small_work_off_what_a_whole_gpu_waiter_needs() -> None:
    state = host(2)
    a, b, c = client(pid=1), client(pid=2, number=2), client(pid=3, number=3)
    acquire(state, a, 1, 0.5)
    acquire(state, a, 2, 0.5)
    assert state.core.free == (0, FULL)
    assert isinstance(only(acquire(state, b, 1, count=2)), p.Queued)
    assert isinstance(only(acquire(state, c, 1, 0.3)), p.Queued)  # GPU 1 is reserved for b
    assert only(acquire(state, c, 2, 0.3, wait=False)) == p.Busy(2)
    assert state.release(a, p.Release(3, 1), 1.0) == []
    out = state.release(a, p.Release(4, 2), 1.0)
    assert out == [(b, p.Granted(1, 3, (0, 1), FULL))]


@pytest.mark.parametrize(("policy", "reserved"), [("easy", 1), ("reserve-all", 2)])
def test_the_policy_decides_how_many_waiters_reserve(policy: str, reserved: int) -> None:
    state = HostState(2, admins={0}, policy=policy)
    a, b = client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1, 0.6)
    acquire(state, a, 2, 0.6)
    acquire(state, b, 1, 0.7)
    acquire(state, b, 2, 0.7)
    assert state.core.policy == policy
    assert len(state.core.reservations()) == reserved  # easy: the head only


def test_a_release_teaches_the_core_the_hold_time() -> None:
    state, a = host(1), client(pid=1)
    state.acquire(a, p.Acquire(1, 1, HALF, True), 10.0)
    state.release(a, p.Release(2, 1), 16.5)
    assert state.core.expected(Demand(1, HALF)) == 6.5


def test_a_limit_from_the_client_decides_a_backfill_onto_the_heads_gpu() -> None:
    """A hint (``expected_s``) lets nobody pass the head; a limit the server enforces that
    ends by the head's shadow does (issue 23)."""
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    assert isinstance(only(state.acquire(a, p.Acquire(1, 1, HALF, True, limit_s=10.0), 0.0)),
                      p.Granted)  # fmt: skip
    assert isinstance(only(acquire(state, b, 1)), p.Queued)  # a whole GPU: the head, shadow 10
    hinted = p.Acquire(2, 1, FULL // 10, False, expected_s=0.01)
    short = p.Acquire(3, 1, FULL // 10, False, limit_s=5.0)
    long = p.Acquire(4, 1, FULL // 10, False, limit_s=50.0)
    assert only(state.acquire(b, hinted, 1.0)) == p.Busy(2)  # a hint is not enforced
    assert only(state.acquire(b, long, 1.0)) == p.Busy(4)  # would end past the shadow
    assert isinstance(only(state.acquire(b, short, 1.0)), p.Granted)


def test_withdraw_of_a_waiter_and_of_a_grant_that_raced_it() -> None:
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1)
    acquire(state, b, 1)
    acquire(state, b, 2)
    assert state.withdraw(b, p.Withdraw(3, 1, timed_out=True), 0.0) == []
    out = state.release(a, p.Release(2, 1), 0.0)
    assert out == [(b, p.Granted(2, 3, (0,), FULL))]
    # b gave up on req 2 before the grant reached it: the withdraw hands it back.
    assert state.withdraw(b, p.Withdraw(4, 2, timed_out=False), 0.0) == []
    assert state.core.free == (FULL,)
    snap = state.status(1, 0.0, 0.0)
    assert (snap.granted, snap.released, snap.cancelled, snap.timed_out) == (2, 2, 1, 1)


def test_withdrawing_what_is_gone_is_not_an_error() -> None:
    state, a = host(), client()
    assert state.withdraw(a, p.Withdraw(1, 99, timed_out=False), 0.0) == []


def test_partial_release_by_gpu_then_the_rest() -> None:
    state, a = host(2), client()
    acquire(state, a, 1, count=2)
    assert state.release(a, p.Release(2, 1, gpu=1, units=FULL), 0.0) == []
    assert state.core.free == (0, FULL)
    state.release(a, p.Release(3, 1), 0.0)
    assert state.core.free == (FULL, FULL) and a.entries == {}


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (p.Release(9, 42), ErrorCode.NOT_FOUND),
        (p.Release(9, 2), ErrorCode.BAD_MESSAGE),  # still waiting
        (p.Release(9, 1, gpu=0, units=FULL), ErrorCode.BAD_MESSAGE),  # holds only half
        (p.Release(9, 1, gpu=1, units=1), ErrorCode.BAD_MESSAGE),  # not on that GPU
    ],
)
def test_bad_releases_change_nothing(message: p.Release, code: ErrorCode) -> None:
    state, a = host(2), client()
    acquire(state, a, 1, 0.5)
    acquire(state, a, 2, count=2)
    before = (state.core.free, state.journal())
    with pytest.raises(ProtocolError) as info:
        state.release(a, message, 0.0)
    assert info.value.code is code and info.value.req == 9
    assert (state.core.free, state.journal()) == before


@pytest.mark.parametrize(
    ("count", "units", "match"),
    [(3, FULL, "has 2 GPUs"), (1, FULL + 1, "units="), (2, HALF, "granted whole")],
)
def test_demands_the_host_cannot_serve_are_bad_requests(count: int, units: int, match: str) -> None:
    state, a = host(2), client()
    with pytest.raises(ProtocolError, match=match) as info:
        state.acquire(a, p.Acquire(5, count, units, True), 0.0)
    assert info.value.code is ErrorCode.BAD_REQUEST and a.entries == {}


def test_a_req_in_use_is_refused() -> None:
    state, a = host(1), client()
    acquire(state, a, 1)
    with pytest.raises(ProtocolError, match="already in use"):
        acquire(state, a, 1)


def test_one_clients_req_numbers_do_not_touch_anothers() -> None:
    state, a, b = host(2), client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1)
    acquire(state, b, 1)
    with pytest.raises(ProtocolError) as info:
        state.release(b, p.Release(2, 5), 0.0)
    assert info.value.code is ErrorCode.NOT_FOUND
    state.release(b, p.Release(2, 1), 0.0)
    assert len(a.entries) == 1 and state.core.free == (0, FULL)


# ----------------------------------------------------------------- cancel
def test_owner_may_cancel_a_waiter_which_is_told() -> None:
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1)
    acquire(state, b, 4)
    out = state.cancel(b, p.Cancel(5, 2), 0.0)
    assert out[0] == (b, p.Done(5, "waiter"))
    assert out[1][0] is b and isinstance(out[1][1], p.ErrorReply)
    assert out[1][1].code is ErrorCode.CANCELLED and out[1][1].req == 4
    assert b.entries == {}


def test_other_users_may_not_cancel_but_admins_may_revoke() -> None:
    state = host(1)
    owner, other, admin = client(uid=1000), client(uid=1001, number=2), client(uid=500, number=3)
    state.job_runs = lambda holder: holder is owner
    acquire(state, owner, 3)
    with pytest.raises(ProtocolError, match="only its owner or an admin") as info:
        state.cancel(other, p.Cancel(1, 1), 0.0)
    assert info.value.code is ErrorCode.FORBIDDEN and state.core.free == (0,)
    out = state.cancel(admin, p.Cancel(1, 1), 0.0)
    assert out == [(admin, p.Done(1, "lease")), (owner, p.Revoked(3, 1, 500))]
    assert state.core.free == (0,) and owner.entries == {}  # held until its holder is gone
    state.disconnect(owner, 1.0)
    assert state.core.free == (FULL,)
    with pytest.raises(ProtocolError) as info:
        state.cancel(admin, p.Cancel(2, 1), 0.0)
    assert info.value.code is ErrorCode.NOT_FOUND


def test_a_revoked_lease_cannot_be_released_twice() -> None:
    state, owner, root = host(1), client(), client(uid=0, number=2)
    state.job_runs = lambda holder: holder is owner
    acquire(state, owner, 3)
    state.cancel(root, p.Cancel(1, 1), 0.0)
    with pytest.raises(ProtocolError):
        state.release(owner, p.Release(4, 3), 0.0)
    assert state.core.free == (0,)  # its holder's processes may still run
    state.disconnect(owner, 1.0)
    assert state.core.free == (FULL,)


# ----------------------------------------------------------------- disconnect
def test_disconnect_frees_leases_and_withdraws_waiters_at_once() -> None:
    state, a, b = host(2), client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1, count=2)
    acquire(state, b, 1, 0.5)
    acquire(state, a, 2, 0.5)  # a's own waiter must not be granted what a frees
    out = state.disconnect(a, 0.0)
    assert out == [(b, p.Granted(1, 2, (0,), HALF))]
    assert state.core.free == (HALF, FULL) and state.core.queue_length == 0


def test_disconnect_of_an_idle_client_is_quiet() -> None:
    lines: list[str] = []
    state = HostState(1, log=lines.append)
    assert state.disconnect(client(), 0.0) == [] and lines == []


# ----------------------------------------------------------------- owners: the uid (issue 23)
@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_a_user_flooding_the_queue_does_not_hold_back_another_user(policy: str) -> None:
    """uid 1000 holds both GPUs and queues five more; uid 2000 queues one a second later,
    behind them all, and is granted at the next release (fair share between owners, the
    uids), not last."""
    state = HostState(2, admins={0}, policy=policy)
    flood, other = client(uid=1000, pid=1), client(uid=2000, pid=2, number=2)
    for req in range(1, 8):
        acquire(state, flood, req)
    assert only(state.acquire(other, p.Acquire(1, 1, FULL, True), 1.0)) == p.Queued(1, 8)
    assert state.release(flood, p.Release(20, 1), 10.0) == [(other, p.Granted(1, 8, (0,), FULL))]
    assert state.release(flood, p.Release(21, 2), 11.0) == [(flood, p.Granted(3, 3, (1,), FULL))]


def test_the_core_counts_each_request_as_its_clients_uid() -> None:
    state = host(2)
    alice, bob = client(uid=1000, pid=1), client(uid=2000, pid=2, number=2)
    acquire(state, alice, 1, 0.5)
    acquire(state, bob, 1, count=1)
    state.release(alice, p.Release(2, 1), 10.0)
    assert state.core.running(1000) == 0 and state.core.running(2000) == 1
    assert state.core.usage(1000, 10.0) > 0 and state.core.usage(None, 10.0) == 0


def test_a_priority_reorders_its_users_own_waiters_only() -> None:
    """Alice's urgent request passes her own waiters (not the head, which keeps its place:
    rule 10e), never bob's: bob, with less usage, still comes first."""
    state = host(1)
    alice, bob = client(uid=1000, pid=1), client(uid=2000, pid=2, number=2)
    acquire(state, alice, 1)  # holds the GPU
    for req in (2, 3):
        state.acquire(alice, p.Acquire(req, 1, FULL, True), 0.0)
    assert only(state.acquire(bob, p.Acquire(1, 1, FULL, True), 1.0)) == p.Queued(1, 4)
    urgent = p.Acquire(4, 1, FULL, True, priority=p.MAX_PRIORITY)
    assert only(state.acquire(alice, urgent, 1.0)) == p.Queued(4, 5)
    assert [w.id for w in state.status(1, 1.0, 0.0).waiting] == [4, 5, 2, 3]
    assert state.release(alice, p.Release(5, 1), 2.0) == [(bob, p.Granted(1, 4, (0,), FULL))]
    granted = [state.release(c, p.Release(6, r), t)[0][1] for c, r, t in ((bob, 1, 3.0),
               (alice, 2, 4.0), (alice, 4, 5.0))]  # fmt: skip
    assert [g.id for g in granted if isinstance(g, p.Granted)] == [2, 5, 3]


def test_status_lists_each_owner_busiest_first_with_shares_usage_running_queued() -> None:
    state = HostState(2, admins={0}, shares={3000: 4.0})
    alice, bob = client(uid=1000, pid=1), client(uid=2000, pid=2, number=2)
    acquire(state, alice, 1)
    acquire(state, alice, 2, 0.5)
    acquire(state, alice, 3)
    acquire(state, bob, 1)
    owners = state.status(1, 10.0, 0.0).owners
    assert [(o.uid, o.share, o.running, o.queued) for o in owners] == [
        (1000, 1.0, 1.5, 1), (2000, 1.0, 0.0, 1), (3000, 4.0, 0.0, 0),
    ]  # fmt: skip
    assert owners[0].usage_gpu_s == pytest.approx(state.core.usage(1000, 10.0))
    assert 14.0 < owners[0].usage_gpu_s < 15.0  # 1.5 GPUs for 10 s, decayed a little
    assert owners[1].usage_gpu_s == 0.0


def test_a_reclaimed_lease_counts_as_its_clients_uid() -> None:
    state = host(2)
    state.start_recovery(journal_of(), 0.0, 5.0, alive=lambda pid: True, complete=False)
    state.reclaim(client(uid=1000, pid=1), p.Reclaim(1, 5, 1, FULL, ((1, FULL),), 0.0), 0.0)
    state.reclaim(client(uid=2000, pid=2), p.Reclaim(1, 6, 1, HALF, None, 0.0), 0.0)
    state.check_recovery(5.0)
    assert state.core.running(1000) == 1 and state.core.running(2000) == 0.5
    assert state.core.running(None) == 0


# ----------------------------------------------------------------- recovery
def journal_of(*entries: JournalEntry, id_limit: int = 100) -> Journal:
    return Journal(id_limit, entries)


def test_recovery_holds_grants_back_until_every_live_client_reclaimed() -> None:
    state = host(2)
    journal = journal_of(
        JournalEntry(5, 1000, 11, 1, HALF, ((0, HALF),)),
        JournalEntry(6, 1000, 12, 1, FULL, ((1, FULL),)),  # pid 12 is dead
        JournalEntry(7, 1000, 11, 1, FULL),  # a waiter of pid 11
    )
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: pid != 12)
    newcomer, old = client(pid=13, number=1), client(pid=11, number=2)
    assert only(acquire(state, newcomer, 1, 0.5)) == p.Queued(1, 100)  # held back
    assert only(acquire(state, newcomer, 2, 0.5, wait=False)) == p.Busy(2)
    reclaim = p.Reclaim(1, 5, 1, HALF, ((0, HALF),), 2.0)
    assert only(state.reclaim(old, reclaim, 0.1)) == p.Granted(1, 5, (0,), HALF)
    assert only(state.reclaim(old, p.Reclaim(2, 7, 1, FULL, None, 1.0), 0.1)) == p.Queued(2, 7)
    assert state.core.free == (HALF, FULL) and state.recovery is not None
    out = state.reclaimed(old, 0.2)
    assert state.recovery is None
    assert out == [  # in id order: the old waiter first, on the GPU it needs whole
        (old, p.Granted(2, 7, (1,), FULL)),
        (newcomer, p.Granted(1, 100, (0,), HALF)),
    ]
    leases = state.status(1, 0.2, 0.0).leases
    assert leases[0].id == 5 and leases[0].age_s == pytest.approx(2.1)


def test_recovery_ends_at_its_deadline_and_what_was_not_reclaimed_is_free() -> None:
    state = host(1)
    state.start_recovery(journal_of(JournalEntry(5, 0, 11, 1, FULL, ((0, FULL),))), 0.0, 5.0,
                         alive=lambda pid: True)  # fmt: skip
    c = client(pid=20)
    acquire(state, c, 1)
    assert state.check_recovery(4.9) == [] and state.recovery is not None
    assert state.check_recovery(5.0) == [(c, p.Granted(1, 100, (0,), FULL))]


def test_recovery_ends_early_when_the_remaining_pids_die() -> None:
    state, alive = host(1), {11}
    state.start_recovery(journal_of(JournalEntry(5, 0, 11, 1, FULL, ((0, FULL),))), 0.0, 5.0,
                         alive=alive.__contains__)  # fmt: skip
    assert state.check_recovery(1.0, alive.__contains__) == [] and state.recovery is not None
    alive.clear()
    state.check_recovery(1.1, alive.__contains__)
    assert state.recovery is None


def test_recovery_with_an_unreadable_journal_waits_for_the_deadline() -> None:
    state = host(1)
    state.start_recovery(Journal(1), 0.0, 5.0, alive=lambda pid: True, complete=False)
    assert state.check_recovery(1.0) == [] and state.recovery is not None
    state.check_recovery(5.0)
    assert state.recovery is None


def test_a_reclaim_that_does_not_fit_is_lost_and_changes_nothing() -> None:
    state = host(2)
    state.start_recovery(journal_of(), 0.0, 5.0, alive=lambda pid: True, complete=False)
    a, b = client(pid=1), client(pid=2, number=2)
    state.reclaim(a, p.Reclaim(1, 5, 1, FULL, ((1, FULL),), 0.0), 0.0)
    with pytest.raises(ProtocolError, match="only 0 free") as info:
        state.reclaim(b, p.Reclaim(1, 6, 2, FULL, ((0, FULL), (1, FULL)), 0.0), 0.0)
    assert info.value.code is ErrorCode.LOST
    assert state.core.free == (FULL, 0) and b.entries == {}


def late_lease(state: HostState, entry: JournalEntry) -> None:
    """Recovery that ends, at its deadline, without ``entry`` reclaimed (its pid lives)."""
    state.start_recovery(journal_of(entry), 0.0, 5.0, alive=lambda pid: True)
    state.check_recovery(5.0)
    assert state.recovery is None


def test_after_recovery_a_late_lease_is_taken_back_only_when_nobody_waits() -> None:
    state, a = host(1), client(pid=1)
    late = Client(2, 1000, 11, token="a")
    late_lease(state, JournalEntry(5, 1000, 11, 1, HALF, ((0, HALF),), token="a"))
    state._late[6] = JournalEntry(6, 1000, 11, 1, HALF, ((0, HALF),), token="a")  # another
    assert only(state.reclaim(late, p.Reclaim(1, 5, 1, HALF, ((0, HALF),), 0.0), 6.0)) == (
        p.Granted(1, 5, (0,), HALF)  # its journaled id
    )
    acquire(state, a, 1)  # waits: only half is free
    with pytest.raises(ProtocolError) as info:
        state.reclaim(late, p.Reclaim(2, 6, 1, HALF, ((0, HALF),), 0.0), 6.0)
    assert info.value.code is ErrorCode.LOST


def test_a_reclaim_of_a_lease_never_journaled_is_lost_after_recovery_too() -> None:
    """The limits bypass of the issue: a reclaim of made-up leases on a server that is not
    recovering took every GPU, whatever its owner's limits."""
    state = HostState(4, admins={0}, default_limits=OwnerLimits(gpus=1))
    bob = client(uid=1001, pid=12)
    everything = tuple((gpu, FULL) for gpu in range(4))
    for ident, held in ((7, everything), (1, ((0, FULL),))):
        with pytest.raises(ProtocolError, match=f"lease #{ident}") as info:
            state.reclaim(bob, p.Reclaim(1, ident, len(held), FULL, held, 1.0), 0.1)
        assert info.value.code is ErrorCode.LOST
    assert state.core.free == (FULL,) * 4 and bob.entries == {}


def test_a_journaled_lease_past_its_owners_limit_is_refused_with_the_limit() -> None:
    state = HostState(2, admins={0}, limits={1000: OwnerLimits(gpus=1)})
    journal = journal_of(
        JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),), token="a"),
        JournalEntry(6, 1000, 11, 1, FULL, ((1, FULL),), token="a"),
    )  # held before the limit was set
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    owner = Client(1, 1000, 11, token="a")
    assert only(state.reclaim(owner, p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 1.0), 0.1)) == (
        p.Granted(1, 5, (0,), FULL)
    )
    with pytest.raises(ProtocolError, match=r"limited to 1 GPU held at once") as info:
        state.reclaim(owner, p.Reclaim(2, 6, 1, FULL, ((1, FULL),), 1.0), 0.1)
    assert info.value.code is ErrorCode.LIMIT
    assert state.core.free == (0, FULL) and state.core.running(1000) == 1
    assert list(owner.entries) == [1]


def test_a_journaled_lease_past_the_cap_on_requests_is_refused() -> None:
    """Restarted with max-requests-per-user 1: the second journaled lease is refused."""
    state = HostState(2, admins={0}, max_per_user=1)
    journal = journal_of(
        JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),), token="a"),
        JournalEntry(6, 1000, 11, 1, FULL, ((1, FULL),), token="a"),
    )
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    owner = Client(1, 1000, 11, token="a")
    state.reclaim(owner, p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 1.0), 0.1)
    with pytest.raises(ProtocolError, match="max-requests-per-user 1") as info:
        state.reclaim(owner, p.Reclaim(2, 6, 1, FULL, ((1, FULL),), 1.0), 0.1)
    assert info.value.code is ErrorCode.LIMIT
    assert state.core.free == (0, FULL) and list(owner.entries) == [1]


def test_with_an_unreadable_journal_a_lease_is_taken_back_within_its_owners_limits() -> None:
    state = HostState(2, admins={0}, limits={1000: OwnerLimits(running=1)})
    state.start_recovery(journal_of(), 0.0, 5.0, alive=lambda pid: True, complete=False)
    owner = client(uid=1000, pid=11)
    both = ((0, FULL), (1, FULL))
    assert only(state.reclaim(owner, p.Reclaim(1, 5, 2, FULL, both, 1.0), 0.1)) == (
        p.Granted(1, 100, (0, 1), FULL)  # one lease on two GPUs: one running grant
    )
    with pytest.raises(ProtocolError, match="limited to 1 running grant") as info:
        state.reclaim(owner, p.Reclaim(2, 6, 1, HALF, ((0, HALF),), 1.0), 0.1)
    assert info.value.code is ErrorCode.LIMIT


def test_a_recovered_lease_counts_in_its_owners_usage_from_its_journaled_start() -> None:
    """A restart credited a recovered lease with usage from the core's clock's origin (the
    boot: thousands of GPU-seconds); it counts from its journaled start."""
    state = host(1)
    journal = journal_of(JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),), token="a",
                                      start=5000.0))  # fmt: skip
    state.start_recovery(journal, 5030.0, 5.0, alive=lambda pid: True)
    owner = Client(1, 1000, 11, token="a")
    state.reclaim(owner, p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 1.0), 5030.0)
    assert state.core.usage(1000, 5060.0) == pytest.approx(60.0, rel=0.02)  # held 60 s
    assert state.status(1, 5060.0, 0.0).leases[0].age_s == pytest.approx(60.0)
    (entry,) = state.journal().entries
    assert entry.start == 5000.0  # journaled again as it was


def test_a_granted_lease_is_journaled_with_its_start() -> None:
    state = host(1)
    state.acquire(client(), p.Acquire(1, 1, FULL, True), 7.0)
    (entry,) = state.journal().entries
    assert entry.start == 7.0


# ----------------------------------------------------------------- journal and ids
def test_journal_lists_leases_then_the_queue_in_order() -> None:
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1)
    acquire(state, b, 1, 0.5)
    acquire(state, a, 2, 0.25)
    journal = state.journal()
    assert [(e.id, e.pid, e.held) for e in journal.entries] == [
        (1, 1, ((0, FULL),)),
        (2, 2, None),
        (3, 1, None),
    ]
    assert journal.id_limit > 3


def test_journal_keeps_what_recovery_still_expects() -> None:
    state = host(1)
    expected = JournalEntry(5, 0, 11, 1, FULL, ((0, FULL),))
    state.start_recovery(journal_of(expected), 0.0, 5.0, alive=lambda pid: True)
    assert state.journal().entries == (expected,)
    assert state.journal().id_limit >= 100


def test_ids_come_in_journaled_blocks() -> None:
    state, a = HostState(1, max_per_connection=ID_BLOCK + 2), client()
    limits = set()
    for req in range(ID_BLOCK + 2):
        acquire(state, a, req, 0.000001, wait=False)
        assert state.id_limit >= state.next_id
        limits.add(state.id_limit)
    assert len(limits) == 2


def test_status_shows_leases_and_the_queue_with_reservations() -> None:
    state, a, b = host(2), client(pid=1), client(uid=1001, pid=2, number=2)
    acquire(state, a, 1, 0.5)
    acquire(state, b, 1, count=2)
    status = state.status(9, 3.0, 1.0)
    assert status.req == 9 and status.free == (HALF, FULL) and status.uptime_s == 2.0
    assert [(x.id, x.uid, x.pid, x.held) for x in status.leases] == [(1, 1000, 1, ((0, HALF),))]
    assert [(w.id, w.count, w.reserved) for w in status.waiting] == [(2, 2, (0, 1))]


# ----------------------------------------------------------------- reclaims belong to a client
def test_reclaimed_ends_only_its_own_clients_pending_requests_not_its_pids() -> None:
    state = host(2)
    journal = journal_of(  # one process (pid 11), two pools: tokens "a" and "b"
        JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),), token="a"),
        JournalEntry(6, 1000, 11, 1, FULL, ((1, FULL),), token="b"),
    )
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    pool_a = Client(1, 1000, 11, token="a")
    newcomer = client(pid=12, number=2)
    state.reclaim(pool_a, p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 1.0), 0.1)
    assert state.reclaimed(pool_a, 0.1) == []
    assert state.recovery is not None and list(state.recovery.pending) == [6]
    assert only(acquire(state, newcomer, 1)) == p.Queued(1, 100)  # held back: GPU 1 is b's
    pool_b = Client(3, 1000, 11, token="b")
    assert only(state.reclaim(pool_b, p.Reclaim(1, 6, 1, FULL, ((1, FULL),), 1.0), 0.2)) == (
        p.Granted(1, 6, (1,), FULL)
    )
    state.reclaimed(pool_b, 0.2)
    assert state.recovery is None and state.core.free == (0, 0)


def test_reclaimed_of_entries_without_a_token_falls_back_to_the_pid() -> None:
    state = host(2)
    journal = journal_of(
        JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),)),
        JournalEntry(6, 1000, 12, 1, FULL, ((1, FULL),)),
    )
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    state.reclaimed(Client(1, 1001, 12), 0.1)  # another uid with that pid: not its entry
    state.reclaimed(Client(2, 1000, 11, token="x"), 0.1)
    assert state.recovery is not None and list(state.recovery.pending) == [6]


def test_the_journal_keeps_each_requests_token() -> None:
    state = host(1)
    acquire(state, Client(1, 1000, 11, token="t1"), 1)
    assert [e.token for e in state.journal().entries] == ["t1"]


MINE = JournalEntry(5, 1000, 11, 1, HALF, ((0, HALF),), token="a")


@pytest.mark.parametrize(
    ("who", "reclaim", "match"),
    [
        (Client(9, 1001, 11, token="a"), p.Reclaim(1, 5, 1, HALF, ((0, HALF),), 1.0), "uid 1000"),
        (Client(9, 1000, 11, token="b"), p.Reclaim(1, 5, 1, HALF, ((0, HALF),), 1.0),
         "another client of this uid"),
        (Client(9, 1000, 11), p.Reclaim(1, 5, 1, HALF, ((0, HALF),), 1.0), "another client"),
        (Client(9, 1000, 11, token="a"), p.Reclaim(1, 5, 1, HALF, ((1, HALF),), 1.0),
         "does not match the journal"),
        (Client(9, 1000, 11, token="a"), p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 1.0),
         "does not match the journal"),
        (Client(9, 1000, 11, token="a"), p.Reclaim(1, 5, 1, HALF, None, 1.0),
         "does not match the journal"),
        (Client(9, 1000, 11, token="a"),
         p.Reclaim(1, 5, 2, FULL, ((0, FULL), (1, FULL)), 1.0), "does not match the journal"),
    ],
)  # fmt: skip
def test_a_journaled_request_is_reclaimed_only_by_its_client_as_journaled(
    who: Client, reclaim: p.Reclaim, match: str
) -> None:
    state = host(2)
    state.start_recovery(journal_of(MINE), 0.0, 5.0, alive=lambda pid: True)
    before = (state.core.free, state.journal(), dict(state.recovery.pending))  # type: ignore[union-attr]
    with pytest.raises(ProtocolError, match=match) as info:
        state.reclaim(who, reclaim, 0.1)
    assert info.value.code is ErrorCode.FORBIDDEN and info.value.req == 1
    assert "#5" in info.value.message
    after = (state.core.free, state.journal(), dict(state.recovery.pending))  # type: ignore[union-attr]
    assert after == before and who.entries == {}
    owner = Client(10, 1000, 11, token="a")
    assert only(state.reclaim(owner, p.Reclaim(1, 5, 1, HALF, ((0, HALF),), 1.0), 0.2)) == (
        p.Granted(1, 5, (0,), HALF)
    )


def test_an_old_entry_without_a_token_is_reclaimed_by_its_pid_only() -> None:
    state = host(1)
    state.start_recovery(journal_of(JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),))), 0.0,
                         5.0, alive=lambda pid: True)  # fmt: skip
    with pytest.raises(ProtocolError, match="another client") as info:
        state.reclaim(Client(1, 1000, 12), p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 1.0), 0.1)
    assert info.value.code is ErrorCode.FORBIDDEN and state.core.free == (FULL,)
    same = Client(2, 1000, 11, token="new")
    assert isinstance(only(state.reclaim(same, p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 1.0), 0.1)),
                      p.Granted)  # fmt: skip


def test_during_recovery_a_lease_the_journal_does_not_name_is_lost() -> None:
    state = host(2)
    state.start_recovery(journal_of(MINE), 0.0, 5.0, alive=lambda pid: True)
    intruder = client(uid=1001, pid=12)
    for ident in (6, 1):  # a made-up id, and an old one that is not pending
        with pytest.raises(ProtocolError, match=f"lease #{ident}") as info:
            state.reclaim(intruder, p.Reclaim(1, ident, 1, FULL, ((0, FULL),), 1.0), 0.1)
        assert info.value.code is ErrorCode.LOST
    assert state.core.free == (FULL, FULL) and intruder.entries == {}


def test_a_waiter_the_journal_does_not_name_queues_behind_the_journaled_ones() -> None:
    state = host(1)
    journal = journal_of(JournalEntry(7, 1000, 11, 1, FULL, token="a"))
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    intruder, owner = client(uid=1001, pid=12), Client(2, 1000, 11, token="a")
    assert only(state.reclaim(intruder, p.Reclaim(1, 1, 1, FULL, None, 9.0), 0.1)) == (
        p.Queued(1, 100)  # not id 1: ids order the held-back queue
    )
    assert only(state.reclaim(owner, p.Reclaim(1, 7, 1, FULL, None, 1.0), 0.1)) == p.Queued(1, 7)
    assert state.reclaimed(owner, 0.2) == [(owner, p.Granted(1, 7, (0,), FULL))]


@pytest.mark.parametrize("recovering", [True, False])
def test_a_reclaim_naming_one_gpu_twice_is_refused_and_changes_nothing(recovering: bool) -> None:
    state, owner = host(1), Client(1, 1000, 11, token="a")
    if recovering:
        journal = journal_of(JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),), token="a"))
        state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    before = (state.core.free, state.journal())
    twice = p.Reclaim(1, 5, 1, FULL, ((0, FULL - 1), (0, 1)), 1.0)
    with pytest.raises(ProtocolError, match="twice") as info:
        state.reclaim(owner, twice, 0.1)
    assert info.value.code is ErrorCode.BAD_MESSAGE and "#5" in info.value.message
    assert (state.core.free, state.journal()) == before and owner.entries == {}


# ----------------------------------------------------------------- caps and control connections
def test_requests_are_capped_per_connection_and_per_uid() -> None:
    state = HostState(1, max_per_connection=2, max_per_user=3)
    a, b, other = client(pid=1), client(pid=2, number=2), client(uid=1001, pid=3, number=3)
    acquire(state, a, 1, 0.1)
    acquire(state, a, 2, 0.1, wait=False)
    with pytest.raises(ProtocolError, match="max-requests-per-connection 2") as info:
        acquire(state, a, 3, 0.1)
    assert info.value.code is ErrorCode.LIMIT and info.value.req == 3 and len(a.entries) == 2
    acquire(state, b, 1, 0.1)
    with pytest.raises(
        ProtocolError, match=r"uid 1000 already has 3 requests.*max-requests-per-user 3"
    ):
        acquire(state, b, 2, 0.1, wait=False)
    assert isinstance(only(acquire(state, other, 1, 0.1)), p.Granted)  # other users unaffected
    state.release(a, p.Release(9, 1), 0.0)
    assert isinstance(only(acquire(state, b, 2, 0.1)), p.Granted)  # room again


def test_the_caps_must_be_positive_ints() -> None:
    with pytest.raises(ValueError, match="max_per_user must be an int >= 1, got 0"):
        HostState(1, max_per_user=0)


def test_a_control_connection_may_not_acquire_or_reclaim() -> None:
    state, control = host(1), Client(1, 1000, 11, control=True)
    with pytest.raises(ProtocolError, match="control connection") as info:
        acquire(state, control, 1)
    assert info.value.code is ErrorCode.FORBIDDEN
    with pytest.raises(ProtocolError, match="control connection"):
        state.reclaim(control, p.Reclaim(2, 5, 1, FULL, None, 0.0), 0.0)
    assert control.entries == {} and state.core.free == (FULL,)
    journal = journal_of(JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),)))  # pid 11's
    state.start_recovery(journal, 0.0, 5.0, alive=lambda pid: True)
    state.reclaimed(control, 0.1)  # a status of the same process says nothing of its leases
    assert state.recovery is not None and list(state.recovery.pending) == [5]


def test_command_lines_are_shown_to_their_owner_and_admins_names_to_all() -> None:
    state = host(2)  # admins: root and uid 500
    mine, theirs = client(uid=1000, pid=1), client(uid=1001, pid=2, number=2)
    state.acquire(mine, p.Acquire(1, 1, FULL, True, "mine", "train --token=A"), 0.0)
    state.acquire(theirs, p.Acquire(1, 2, FULL, True, "theirs", "train --token=B"), 0.0)
    state.acquire(theirs, p.Acquire(2, 1, HALF, True, "queued", "eval --key=C"), 0.0)

    def shown(viewer: int | None) -> list[tuple[str | None, str | None]]:
        status = state.status(1, 0.0, 0.0, viewer)
        return [(r.name, r.command) for r in (*status.leases, *status.waiting)]

    assert shown(1000) == [("mine", "train --token=A"), ("theirs", None), ("queued", None)]
    assert shown(1001) == [
        ("mine", None),
        ("theirs", "train --token=B"),
        ("queued", "eval --key=C"),
    ]
    everything = [("mine", "train --token=A"), ("theirs", "train --token=B"),
                  ("queued", "eval --key=C")]  # fmt: skip
    assert shown(0) == shown(500) == shown(None) == everything


def test_log_lines_name_the_user_and_the_job_escaped() -> None:
    lines: list[str] = []
    state = HostState(1, log=lines.append)
    alice = Client(1, 1000, 42, user="alice (uid 1000)")
    state.acquire(alice, p.Acquire(1, 1, FULL, True, name="train\n#2 fake"), 0.0)
    state.acquire(alice, p.Acquire(2, 1, FULL, True), 0.0)
    state.cancel(Client(2, 0, 7, user="root (uid 0)"), p.Cancel(1, 1), 0.0)
    assert lines[0] == 'grant #1 "train\\n#2 fake" to alice (uid 1000) pid 42: GPU 0'
    assert lines[1] == "wait #2 of alice (uid 1000) pid 42: 1 whole GPU"
    assert (
        lines[2] == 'revoke #1 "train\\n#2 fake" of alice (uid 1000) pid 42 by root (uid 0): GPU 0'
    )
    assert Client(3, 1001, 9).__str__() == "uid 1001 pid 9"  # no name known


# ----------------------------------------------------------------- time limits
def test_a_lease_past_its_limit_is_revoked_and_its_capacity_granted_on() -> None:
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    state.job_runs = lambda holder: holder is a
    assert only(state.acquire(a, p.Acquire(1, 1, FULL, True, limit_s=5.0), 1.0)) == p.Granted(
        1, 1, (0,), FULL
    )
    assert only(acquire(state, b, 1)) == p.Queued(1, 2)
    assert state.next_limit_end() == 6.0
    assert state.expire(5.999) == []
    out = state.expire(6.0)
    assert out == [(a, p.Revoked(1, 1, 1000, "limit"))]  # held while its processes end
    assert state.next_limit_end() is None and state.released == 1
    assert state.disconnect(a, 6.5) == [(b, p.Granted(1, 2, (0,), FULL))]
    journaled = {e.id: e for e in state.journal().entries}
    assert set(journaled) == {2} and journaled[2].limit_end is None
    with pytest.raises(ProtocolError) as caught:  # the revoked lease is gone for its client
        state.release(a, p.Release(2, 1), 7.0)
    assert caught.value.code is ErrorCode.NOT_FOUND


def test_a_revoked_leases_gpus_go_back_at_the_end_of_its_hold_unless_its_job_runs() -> None:
    """A revoked lease's holder keeps its connection: its GPUs go back ``revoked_hold_s``
    after the revoke, and not while its job still runs (asked again later)."""
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    running = [True]
    state.job_runs = lambda holder: holder is a and running[0]
    acquire(state, a, 1)
    acquire(state, b, 1)
    state.cancel(client(uid=0, number=3), p.Cancel(1, 1), 10.0)
    end = 10.0 + state.revoked_hold_s
    assert state.next_deadline() == end
    assert state.expire(end - 0.001) == []
    assert state.expire(end) == [] and state.core.free == (0,)  # its job still runs
    later = state.next_deadline()
    assert later is not None and later > end
    running[0] = False
    assert state.expire(later) == [(b, p.Granted(1, 2, (0,), FULL))]
    assert state.next_deadline() is None


def test_a_lease_ended_for_overuse_holds_its_gpus_until_its_holder_is_gone() -> None:
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    state.job_runs = lambda holder: holder is a
    acquire(state, a, 1)
    acquire(state, b, 1)
    lease = state.lease(1)
    assert lease is not None
    assert state.end_for_overuse(lease, 0, 1.0) == [(a, p.Revoked(1, 1, 0, "overuse"))]
    assert [e.id for e in state.revoked_leases()] == [1] and state.held_leases() == []
    assert state.disconnect(a, 2.0) == [(b, p.Granted(1, 2, (0,), FULL))]
    assert state.revoked_leases() == []


def test_a_revoked_lease_of_a_holder_with_no_job_goes_back_at_once() -> None:
    """Nothing proves a job of the holder runs (an in-process pool's connection, a client
    the server cannot see into): its revoked lease's GPUs go to the waiter at once, as the
    in-process pool frees them, on a time limit, a cancel and overuse alike."""
    state, a, b, root = host(1), client(pid=1), client(pid=2, number=2), client(uid=0, number=3)
    state.job_runs = lambda holder: False
    state.acquire(a, p.Acquire(1, 1, FULL, True, limit_s=5.0), 0.0)
    acquire(state, b, 1)
    assert state.expire(5.0) == [
        (a, p.Revoked(1, 1, 1000, "limit")), (b, p.Granted(1, 2, (0,), FULL))
    ]  # fmt: skip
    out = state.cancel(root, p.Cancel(4, 2), 6.0)
    assert out == [(root, p.Done(4, "lease")), (b, p.Revoked(1, 2, 0))]
    assert state.core.free == (FULL,) and state.revoked_leases() == []
    acquire(state, a, 2)
    lease = state.lease(3)
    assert lease is not None
    assert state.end_for_overuse(lease, 0, 7.0) == [(a, p.Revoked(2, 3, 0, "overuse"))]
    assert state.core.free == (FULL,) and state.next_deadline() is None


def test_a_lease_released_before_its_limit_is_not_revoked() -> None:
    state, a = host(1), client()
    state.acquire(a, p.Acquire(1, 1, HALF, True, limit_s=5.0), 0.0)
    state.acquire(a, p.Acquire(2, 1, HALF, True), 0.0)
    assert state.journal().entries[0].limit_end == 5.0
    state.release(a, p.Release(3, 1), 1.0)
    assert state.next_limit_end() is None and state.expire(10.0) == []


def test_a_waiters_limit_counts_from_its_grant() -> None:
    state, a, b = host(1), client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1)
    state.acquire(b, p.Acquire(1, 1, FULL, True, limit_s=2.0), 0.0)
    state.release(a, p.Release(2, 1), 10.0)
    assert state.next_limit_end() == 12.0


def test_a_reclaimed_lease_keeps_the_limit_end_its_journal_records() -> None:
    state = host(2)
    journal = journal_of(JournalEntry(5, 1000, 11, 1, FULL, ((0, FULL),), limit_end=40.0))
    state.start_recovery(journal, 30.0, 5.0, alive=lambda pid: True)
    old = client(pid=11)
    # The client says another limit (or none): the journal's end wins.
    reclaim = p.Reclaim(1, 5, 1, FULL, ((0, FULL),), 20.0, limit_s=100.0)
    assert only(state.reclaim(old, reclaim, 30.0)) == p.Granted(1, 5, (0,), FULL)
    assert state.next_limit_end() == 40.0
    assert state.journal().entries[0].limit_end == 40.0
    assert state.expire(40.0)[0] == (old, p.Revoked(1, 5, 1000, "limit"))


def test_a_reclaim_the_journal_does_not_name_counts_its_limit_from_its_age() -> None:
    state = host(2)
    state.start_recovery(journal_of(), 0.0, 5.0, alive=lambda pid: True, complete=False)
    reclaim = p.Reclaim(1, 5, 1, FULL, ((1, FULL),), 3.0, limit_s=10.0)
    state.reclaim(client(pid=1), reclaim, 50.0)
    assert state.next_limit_end() == 57.0


# ----------------------------------------------------------------- limits (rule 11)
def test_a_request_a_uids_limits_refuse_leaves_nothing_behind() -> None:
    state = HostState(1, max_per_user=2, default_limits=OwnerLimits(queued=0))
    a = client(pid=1)
    assert isinstance(only(acquire(state, a, 1)), p.Granted)
    for _ in range(3):  # each refusal frees its place: the cap of 2 per uid is never reached
        with pytest.raises(ProtocolError) as refused:
            acquire(state, a, 2, 0.5)
        assert refused.value.code is ErrorCode.LIMIT and refused.value.req == 2
        assert "is limited to 0 waiting requests" in refused.value.message
    assert 2 not in a.entries and state.core.queue_length == 0
    assert [state.has_id(ident) for ident in (1, 2, 3, 4)] == [True, False, False, False]
    assert len(state.journal().entries) == 1  # the refused ones are journaled as gone


def test_a_held_back_waiter_its_uids_limits_refuse_gets_the_error_when_recovery_ends() -> None:
    state = HostState(1, default_limits=OwnerLimits(gpus=0.5))
    state.start_recovery(journal_of(), 0.0, 5.0, alive=lambda pid: True)
    a = client(pid=1)
    assert only(acquire(state, a, 1)) == p.Queued(1, 100)  # held back, not judged yet
    assert only(acquire(state, a, 2, 0.5)) == p.Queued(2, 101)
    out = state.check_recovery(5.0)
    assert out[0][0] is a and isinstance(out[0][1], p.ErrorReply)
    assert (out[0][1].req, out[0][1].code) == (1, ErrorCode.LIMIT)
    assert out[1] == (a, p.Granted(2, 101, (0,), HALF))
    assert list(a.entries) == [2]


def test_status_says_why_a_waiter_is_held() -> None:
    state = HostState(2, limits={1000: OwnerLimits(running=1)})
    a, b = client(pid=1), client(uid=2000, pid=2, number=2)
    acquire(state, a, 1, 0.5)
    acquire(state, a, 2, 0.5)
    acquire(state, b, 1, 0.5)
    (waiter,) = state.status(9, 1.0, 0.0).waiting
    assert waiter.uid == 1000
    assert waiter.held == "uid 1000 at the limit of 1 running grant (has 1, needs 1 more)"


# ----------------------------------------------------------------- accounts (issue 23)
def team_host(num_gpus: int = 1, **extra: object) -> HostState:
    """uids 1000 and 1001 in account "ml"; every other uid its own owner."""
    return HostState(num_gpus, admins={0}, accounts={"ml": {1000, 1001}}, **extra)  # type: ignore[arg-type]


def test_an_accounts_users_share_one_usage_so_another_user_goes_before_its_second() -> None:
    """uid 1000 (of ml) holds the GPU for 10 s; then uid 1001 (of ml) and uid 2000 queue, in
    that order. Each alone has no usage, so by uid 1001 would come first (the earlier ticket);
    as one account, ml has 10 GPU-seconds and uid 2000 none: uid 2000 goes first."""
    state = team_host(1)
    first, second = client(uid=1000, pid=1), client(uid=1001, pid=2, number=2)
    other = client(uid=2000, pid=3, number=3)
    acquire(state, first, 1)
    assert only(state.acquire(second, p.Acquire(1, 1, FULL, True), 1.0)) == p.Queued(1, 2)
    assert only(state.acquire(other, p.Acquire(1, 1, FULL, True), 2.0)) == p.Queued(1, 3)
    assert state.release(first, p.Release(2, 1), 10.0) == [(other, p.Granted(1, 3, (0,), FULL))]
    assert state.core.usage("ml", 10.0) > 9.0 and state.core.usage(1000, 10.0) == 0
    assert state.owner_of(1001) == "ml" and state.owner_of(2000) == 2000


def test_status_shows_the_account_with_its_users_together_and_each_waiters_account() -> None:
    state = team_host(2, shares={"ml": 3.0, 3000: 2.0})
    first, second = client(uid=1000, pid=1), client(uid=1001, pid=2, number=2)
    other = client(uid=2000, pid=3, number=3)
    acquire(state, first, 1, 0.5)
    acquire(state, second, 1)
    acquire(state, other, 1, 0.5)
    acquire(state, second, 2)  # waits
    acquire(state, other, 2)  # waits
    reply = state.status(1, 10.0, 0.0)
    assert [(a.account, a.share, a.running, a.queued) for a in reply.accounts] == [
        ("ml", 3.0, 1.5, 1)
    ]
    assert reply.accounts[0].usage_gpu_s == pytest.approx(state.core.usage("ml", 10.0))
    assert 14.0 < reply.accounts[0].usage_gpu_s < 15.0  # 0.5 + 1 GPU for 10 s, together
    assert [(o.uid, o.share, o.running, o.queued) for o in reply.owners] == [
        (2000, 1.0, 0.5, 1), (3000, 2.0, 0.0, 0),
    ]  # fmt: skip
    assert [(w.uid, w.account) for w in reply.waiting] == [(1001, "ml"), (2000, None)]
    assert reply.owners_left_out == 0
    wire = reply.wire()
    assert all("uid" in o for o in wire["owners"])  # type: ignore[attr-defined]
    assert wire["accounts"][0]["account"] == "ml"  # type: ignore[index]


def test_an_accounts_limits_count_its_users_together() -> None:
    state = team_host(2, limits={"ml": OwnerLimits(gpus=1)})
    first, second = client(uid=1000, pid=1), client(uid=1001, pid=2, number=2)
    other = client(uid=2000, pid=3, number=3)
    assert isinstance(only(acquire(state, first, 1)), p.Granted)
    assert only(acquire(state, second, 1)) == p.Queued(1, 2)  # held: the account has 1 GPU
    assert isinstance(only(acquire(state, other, 1)), p.Granted)  # the free GPU: not held back
    (waiter,) = state.status(9, 1.0, 0.0).waiting
    assert waiter.held == (
        "account ml (uid 1001) at the limit of 1 GPU held at once (has 1, needs 1 more)"
    )
    assert state.release(other, p.Release(2, 1), 2.0) == []  # still the account's limit
    assert state.release(first, p.Release(2, 1), 3.0) == [(second, p.Granted(1, 2, (0,), FULL))]


def test_an_accounts_refusal_names_the_account() -> None:
    state = team_host(2, limits={"ml": OwnerLimits(gpus=1, mode="refuse")})
    acquire(state, client(uid=1000, pid=1), 1)
    with pytest.raises(ProtocolError) as refused:
        acquire(state, client(uid=1001, pid=2, number=2), 1)
    assert refused.value.code is ErrorCode.LIMIT
    assert refused.value.message.startswith("account ml (uid 1001) is limited to 1 GPU held")


def test_a_reclaimed_lease_counts_as_its_uids_account() -> None:
    state = team_host(2)
    state.start_recovery(journal_of(), 0.0, 5.0, alive=lambda pid: True, complete=False)
    state.reclaim(client(uid=1001, pid=1), p.Reclaim(1, 5, 1, FULL, ((1, FULL),), 0.0), 0.0)
    state.check_recovery(5.0)
    assert state.core.running("ml") == 1 and state.core.running(1001) == 0


def test_owners_left_out_counts_uids_and_accounts_together() -> None:
    accounts = {f"team{n}": {5000 + n} for n in range(p.MAX_OWNERS)}
    state = HostState(1, accounts=accounts, shares={1: 1.0, 2: 1.0})
    for n in range(p.MAX_OWNERS):
        acquire(state, client(uid=5000 + n, pid=n, number=n), 1, 0.001)
    reply = state.status(1, 1.0, 0.0)
    assert len(reply.owners) + len(reply.accounts) == p.MAX_OWNERS
    assert reply.owners_left_out == 2


def test_a_uid_in_two_accounts_is_refused() -> None:
    with pytest.raises(ValueError, match="uid 7 is in accounts 'a' and 'b'"):
        HostState(1, accounts={"a": {7}, "b": {8, 7}})


def test_a_members_priority_passes_its_accounts_waiters_never_another_owners() -> None:
    """Within an account the members' requests are one queue: uid 1001's urgent request
    passes uid 1000's waiter (both of ml), not uid 2000's, who has less usage."""
    state = team_host(1)
    first, second = client(uid=1000, pid=1), client(uid=1001, pid=2, number=2)
    other = client(uid=2000, pid=3, number=3)
    acquire(state, first, 1)  # holds the GPU
    state.acquire(first, p.Acquire(2, 1, FULL, True), 0.0)
    state.acquire(first, p.Acquire(3, 1, FULL, True), 0.0)
    state.acquire(other, p.Acquire(1, 1, FULL, True), 1.0)
    urgent = p.Acquire(1, 1, FULL, True, priority=p.MAX_PRIORITY)
    assert only(state.acquire(second, urgent, 1.0)) == p.Queued(1, 5)
    # uid 2000's #4 first (ml has used the GPU for 1 s), then ml's queue: #5 before #2, #3
    assert [w.id for w in state.status(1, 1.0, 0.0).waiting] == [4, 5, 2, 3]


# ----------------------------------------------------------------- hand-over
def test_a_lease_taken_on_its_own_connection_moves_to_the_takers_req() -> None:
    state, a = HostState(1, max_per_connection=1), client()
    ident = granted_id(acquire(state, a, 1))
    given = only(state.give(a, p.Give(2, ident), 0.0))
    assert isinstance(given, p.Given)
    taken = only(state.take(a, p.Take(3, ident, given.ticket), 1.0))  # at its cap: a move adds none
    assert isinstance(taken, p.Granted) and (taken.req, taken.id) == (3, ident)
    assert list(a.entries) == [3] and state.journal().entries[0].pid == a.pid
    with pytest.raises(ProtocolError) as info:
        state.release(a, p.Release(4, 1), 2.0)  # the old req names nothing now
    assert info.value.code is ErrorCode.NOT_FOUND
    assert state.release(a, p.Release(5, 3), 2.0) == [] and state.core.free == (FULL,)


def test_a_take_past_the_takers_cap_is_refused_and_the_offer_stays() -> None:
    state = HostState(2, max_per_connection=1)
    giver, taker = client(pid=1), client(pid=2, number=2)
    ident = granted_id(acquire(state, giver, 1))
    acquire(state, taker, 1)
    given = only(state.give(giver, p.Give(2, ident), 0.0))
    assert isinstance(given, p.Given)
    with pytest.raises(ProtocolError) as info:
        state.take(taker, p.Take(2, ident, given.ticket), 1.0)
    assert info.value.code is ErrorCode.LIMIT
    assert "max-requests-per-connection 1" in info.value.message
    assert list(giver.entries) == [1]
    state.release(taker, p.Release(3, 1), 1.0)
    assert isinstance(only(state.take(taker, p.Take(4, ident, given.ticket), 1.0)), p.Granted)
    assert state.disconnect(giver, 2.0) == [] and state.core.free == (0, FULL)  # the taker's now
