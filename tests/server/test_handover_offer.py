"""A lease offered for hand-over (``give``) has a bounded life: if nobody takes it within
``handover_s`` (its taker died before it could, say), the server withdraws the offer and
releases the lease, so that a GPU is never held for good by an offer nobody will take.
The server's sans-I/O bookkeeping, on its own clock."""

from __future__ import annotations

import pytest

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._server._defaults import HANDOVER_S
from hwpool._server._host_entries import Client, Delivery
from hwpool._server._host_state import HostState
from hwpool._wire import _protocol as p
from hwpool._wire._protocol import ProtocolError

FULL = UNITS_PER_GPU


def only(deliveries: list[Delivery]) -> p.ServerMessage:
    assert len(deliveries) == 1, deliveries
    return deliveries[0][1]


def offered(state: HostState, giver: Client, at: float) -> tuple[int, str]:
    """A whole GPU granted to ``giver`` and offered for hand-over at ``at``: id, ticket."""
    granted = only(state.acquire(giver, p.Acquire(1, 1, FULL, True), at))
    assert isinstance(granted, p.Granted)
    given = only(state.give(giver, p.Give(2, granted.id), at))
    assert isinstance(given, p.Given)
    return granted.id, given.ticket


def test_an_offer_nobody_takes_in_time_is_withdrawn_and_its_gpu_goes_to_the_waiter() -> None:
    state = HostState(1, admins={0})
    giver, waiter, taker = Client(1, 1000, 10), Client(2, 2000, 20), Client(3, 1000, 30)
    ident, ticket = offered(state, giver, 1.0)
    assert isinstance(only(state.acquire(waiter, p.Acquire(1, 1, FULL, True), 1.0)), p.Queued)
    end = 1.0 + state.handover_s
    assert state.handover_s == HANDOVER_S
    assert state.next_deadline() == end
    assert state.expire(end - 0.001) == []
    out = state.expire(end)
    assert [(to, type(message)) for to, message in out] == [(waiter, p.Granted)]
    assert state.lease(ident) is None
    assert giver.entries == {}
    with pytest.raises(ProtocolError, match="no lease of yours is offered"):
        state.take(taker, p.Take(1, ident, ticket), end)


def test_an_offer_taken_in_time_is_the_takers_and_never_withdrawn() -> None:
    state = HostState(1, admins={0})
    giver, taker = Client(1, 1000, 10), Client(3, 1000, 30)
    ident, ticket = offered(state, giver, 1.0)
    assert isinstance(only(state.take(taker, p.Take(1, ident, ticket), 2.0)), p.Granted)
    assert state.next_deadline() is None
    assert state.expire(1.0 + state.handover_s) == []
    lease = state.lease(ident)
    assert lease is not None and lease.client is taker


def test_an_offer_given_again_lives_from_the_new_give() -> None:
    state = HostState(1, admins={0})
    giver = Client(1, 1000, 10)
    ident, _ = offered(state, giver, 1.0)
    assert isinstance(only(state.give(giver, p.Give(3, ident), 5.0)), p.Given)
    assert state.next_deadline() == 5.0 + state.handover_s
    assert state.expire(1.0 + state.handover_s) == []
    assert state.lease(ident) is not None
