"""The host server's bookkeeping over the scheduler core: who holds and who waits for what.

Sans-I/O, like the core: every input is a decoded message from a known client (plus the time,
passed in), every output a list of ``(client, message)`` deliveries for the I/O layer to send.
A call that answers its caller puts that reply first; the rest are grants (or revocations)
pushed to other clients (``release`` and ``withdraw`` are answered only when they fail). A
request belongs to the connection that made it:
``disconnect`` withdraws its waiters and releases its leases in one step.

After a restart the state starts in recovery: new requests are held back (queued, not
granted) while clients reclaim their leases and waiters; recovery ends when every client the
journal names has sent ``reclaimed`` or is dead, or at the deadline, and the held-back
waiters then enter the core in their original id order. A journaled request belongs to the
client that made it (its uid, and its hello's token, or its pid where it sent none): only
that client may reclaim it, and only as it was journaled.

A lease may change hands between two connections of one uid (``give``, then ``take`` with
the secret ticket ``give`` answered): it then belongs to the taker's connection as if the
taker had made it (its release, its disconnection, its reclaim after a restart: the journal
names the taker's pid and token), and its owner, id, GPUs and time limit stay the same. An
offer not taken within ``handover_s`` is withdrawn and its lease released.

A revoked lease (``hwpool cancel``, its time limit, ended for overuse) is gone for its client
and the journal at once. Its GPUs go back at once unless ``job_runs`` says a job of its
holder runs (a proven job group: ``hwpool run``, a job's launcher); then they stay held
(granted to no one else) until the job's processes are gone: until its connection closes
(``hwpool run`` and a job's launcher close it once the job has ended), or, at the latest,
``revoked_hold_s`` after the revoke (the launcher's SIGTERM grace and a margin) unless
``job_runs`` says the job still runs then (asked again every ``REVOKED_RECHECK_S``). A
restart forgets the hold.

One client cannot flood the others: a connection holds at most ``max_per_connection``
requests (leases and waiters), a uid at most ``max_per_user`` over all its connections.

Its parts, each with one job (a chain of classes, each adding to the one below):
``_host_entries`` (clients, entries, deliveries), ``_host_books`` (the books and the
journal's view of them), ``_host_admission`` (a request checked and admitted),
``_host_revokes`` (time limits, revocations, lapsed offers, overuse), ``_host_recovery``
(after a restart), ``_host_drain`` (drained GPUs, memory withheld), ``_host_status`` (the
status answer); this module adds the requests.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Literal

from .._core._limits import LimitExceeded
from .._wire._protocol import (
    Acquire,
    Busy,
    Cancel,
    Done,
    ErrorCode,
    ErrorReply,
    Give,
    Given,
    Granted,
    ProtocolError,
    Release,
    Revoked,
    ServerMessage,
    Take,
    TakenRequest,
    Withdraw,
)
from ._host_entries import Client, Delivery, Entry, _count, _job
from ._host_status import _HostStatus

__all__ = ["HostState"]


class HostState(_HostStatus):
    """The leases and waiters of every client, over one :class:`Scheduler`.

    ``admins`` are the uids that may cancel anyone's requests (root and the server's own).
    ``totals`` sizes the GPUs in memory (MiB each; see the protocol's ``unit``); without it
    each has ``units_per_gpu``. ``mig``: the GPUs are MIG instances, so no request may have
    more than one. ``max_per_connection`` and ``max_per_user`` cap the requests (leases and
    waiters) of one connection and of one uid. A request's owner in the core is its
    client's uid, or the account the uid is in (``accounts``: name -> member uids, a uid in
    one at most): an account's members share one fair share, one usage and one set of limits.
    ``shares`` (owner -> share; default 1 each) and ``half_life`` set the fair share between
    owners (the core's rules 8-10); ``limits`` (owner -> limits) and ``default_limits``
    (every other owner's) what each may hold and queue (rule 11: a request beyond them is
    held, or refused with ``limit``). Methods raise :class:`ProtocolError` for a request
    that cannot be served, changing nothing.
    """

    # ----------------------------------------------------------------- requests
    def acquire(self, client: Client, msg: Acquire, now: float) -> list[Delivery]:
        """A new request: granted at once, queued, or (nowait) refused with ``would_block``."""
        self._data_only(client, msg.req)
        demand = self._demand(
            msg.count, msg.units, msg.unit, msg.req, owner=self.owner_of(client.uid),
            priority=msg.priority,
            limit=msg.limit_s,
        )  # fmt: skip
        self._fresh_req(client, msg.req)
        self._room_for(client, msg.req)
        if not msg.wait:
            try:
                grant = (
                    None
                    if self.recovery
                    else self.core.grant_now(demand, now=now, expected=msg.expected_s)
                )
            except LimitExceeded as exc:
                raise self._refused(client, exc, msg.req) from None
            if grant is None:
                return [(client, Busy(msg.req))]
            entry = self._add(client, msg, demand, now)
            return [self._granted(entry, grant, now)]
        return [self._grant_or_queue(self._add(client, msg, demand, now), now)]

    def withdraw(self, client: Client, msg: Withdraw, now: float) -> list[Delivery]:
        """The client gave up request ``of``: withdraw it, or take back the grant that raced it.

        Not answered. Withdrawing what is already gone is not an error (the client cannot
        know it is gone).
        """
        entry = client.entries.get(msg.of)
        if entry is None:
            return []
        if msg.timed_out:
            self.timed_out += 1
        else:
            self.cancelled += 1
        self.log(f"withdraw {_job(entry)} by {client}" + (" (timed out)" if msg.timed_out else ""))
        return self._remove(entry, now)

    def release(self, client: Client, msg: Release, now: float) -> list[Delivery]:
        """Give back all of lease ``of``, or ``units`` of it on ``gpu`` (answered only on error)."""
        entry = self._entry(client, msg.req, msg.of)
        if entry.held is None:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"request {msg.of} is not granted", msg.req)
        if msg.gpu is None or msg.units is None:
            parts = dict(entry.held)
        else:
            held = entry.held.get(msg.gpu, 0)
            if msg.units > held:
                raise ProtocolError(
                    ErrorCode.BAD_MESSAGE,
                    f"cannot release {msg.units} units on GPU {msg.gpu}: "
                    f"lease {msg.of} holds {held}",
                    msg.req,
                )
            parts = {msg.gpu: msg.units}
        grants = self.core.release_many(parts.items(), ticket=entry.granted_as, now=now)
        for gpu, units in parts.items():
            entry.held[gpu] -= units
            if not entry.held[gpu]:
                del entry.held[gpu]
        held_s = now - entry.since
        self.log(f"release {_job(entry)} by {client}: {self._what(parts)}, held {held_s:.3f} s")
        if not entry.held:
            self.released += 1
            self._drop(entry)
        else:
            entry.partial = True
            entry.handover = None
            self._touch(entry)
        return self._deliver(grants, now)

    def cancel(self, actor: Client, msg: Cancel, now: float) -> list[Delivery]:
        """``hwpool cancel``: withdraw a waiter or revoke a lease, for its owner or an admin.

        The owner is told: a waiter's request fails with ``cancelled``, a lease gets ``revoked``.
        """
        entry = self._by_id.get(msg.id)
        if entry is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no lease or waiter #{msg.id}", msg.req)
        owner = entry.client
        if actor.uid != owner.uid and actor.uid not in self.admins:
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"#{msg.id} belongs to uid {owner.uid}; only its owner or an admin may cancel it",
                msg.req,
            )
        notice: ServerMessage
        by = actor.user or f"uid {actor.uid}"
        if entry.held is not None:
            notice = Revoked(entry.req, entry.id, actor.uid)
            self.log(f"revoke {_job(entry)} of {owner} by {by}: {self._what(entry.held)}")
        else:
            text = f"request #{entry.id} was cancelled by {by} (hwpool cancel)"
            notice = ErrorReply(entry.req, ErrorCode.CANCELLED, text)
            self.cancelled += 1
            self.log(f"cancel {_job(entry)} of {owner} by {by}")
        was: Literal["lease", "waiter"] = "lease" if entry.held is not None else "waiter"
        if entry.held is not None:
            grants = self._hold_revoked(entry, now)
        else:
            grants = self._remove(entry, now)
        return [(actor, Done(msg.req, was)), (owner, notice), *grants]

    # ----------------------------------------------------------------- hand-over
    def give(self, client: Client, msg: Give, now: float) -> list[Delivery]:
        """Offer lease ``msg.id`` of this connection for hand-over: answer ``given`` with a
        fresh ticket (replacing any earlier one). The lease stays ``client``'s until taken.

        Refused (ProtocolError, nothing changed): from a control connection (``forbidden``),
        an id not known (``not_found``), another connection's request (``forbidden``), a
        waiter or a lease partly released (``bad_message``).
        """
        self._data_only(client, msg.req)
        entry = self._by_id.get(msg.id)
        if entry is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no lease #{msg.id}", msg.req)
        if entry.client is not client:
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"lease #{msg.id} is not this connection's: only its holder may hand it over",
                msg.req,
            )
        if entry.held is None:
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE,
                f"#{msg.id} is waiting, not granted: only a lease can be handed over",
                msg.req,
            )
        if entry.partial:
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE,
                f"lease #{msg.id} was partly released: only a whole lease can be handed over",
                msg.req,
            )
        entry.handover = secrets.token_urlsafe(24)
        entry.offered_until = now + self.handover_s
        self._offered[entry.id] = entry
        self.log(f"offer {_job(entry)} of {client} for hand-over ({self.handover_s:g} s)")
        return [(client, Given(msg.req, entry.id, entry.handover))]

    def take(self, client: Client, msg: Take, now: float) -> list[Delivery]:
        """Make ``client`` the holder of lease ``msg.id``, given with ``msg.ticket`` by a
        connection of the same uid: answer ``granted`` (with what it was asked as) under
        ``msg.req``. The ticket is used up; the lease keeps its id, GPUs, owner and time limit.

        Refused with one ``not_found`` message, nothing changed, whatever the reason (no such
        lease, not offered, another uid's, a wrong or used ticket), so that a wrong ticket
        tells nothing of the lease; ``forbidden`` from a control connection; ``limit`` past
        the cap on this connection's requests.
        """
        self._data_only(client, msg.req)
        self._fresh_req(client, msg.req)
        entry = self._by_id.get(msg.id)
        offered = None if entry is None else entry.handover
        if (
            entry is None
            or offered is None
            or entry.held is None
            or entry.client.uid != client.uid
            or not hmac.compare_digest(offered, msg.ticket)
        ):
            raise ProtocolError(
                ErrorCode.NOT_FOUND,
                f"cannot take lease #{msg.id}: no lease of yours is offered with this ticket "
                "(unknown or ended, taken already, its giver gone, or a wrong ticket)",
                msg.req,
            )
        mine = len(client.entries) - (entry.client is client)  # its own moves, adds nothing
        if mine >= self.max_per_connection:
            raise ProtocolError(
                ErrorCode.LIMIT,
                f"this connection already has {mine} requests (leases and waiters), the cap "
                f"per connection (max-requests-per-connection {self.max_per_connection})",
                msg.req,
            )
        giver = entry.client
        del giver.entries[entry.req]
        entry.client, entry.req, entry.handover = client, msg.req, None
        if msg.name is not None:
            entry.name = msg.name
        if msg.command is not None:
            entry.command = msg.command
        client.entries[msg.req] = entry
        self._touch(entry)  # journaled anew: its holder's pid and token
        self.log(f"hand over {_job(entry)} from {giver} to {client}: {self._what(entry.held)}")
        return [(client, Granted(msg.req, entry.id, tuple(entry.held), entry.units,
                                 self._taken_request(entry, now)))]  # fmt: skip

    def _taken_request(self, entry: Entry, now: float) -> TakenRequest:
        """What lease ``entry`` was asked as, for its new holder (see :class:`TakenRequest`)."""
        count, units, unit = self._wire_demand(entry.demand)
        return TakenRequest(
            count, units, max(0.0, now - entry.since), unit, entry.demand.limit, entry.name,
            entry.command,
        )  # fmt: skip

    def disconnect(self, client: Client, now: float) -> list[Delivery]:
        """The connection closed: withdraw every waiter of ``client``, then free its leases
        (and its revoked leases' GPUs: its processes are gone, or no longer hwpool's)."""
        out: list[Delivery] = []
        for revoked in [e for e in self._revoked.values() if e.client is client]:
            out += self._free_revoked(revoked, now, f"its holder {client} has gone")
        if not client.entries:
            return out
        entries = list(client.entries.values())
        freed: dict[int, int] = {}
        for entry in entries:
            if entry.held is None:
                self.cancelled += 1
                out += self._remove(entry, now)
        for entry in entries:
            if entry.held is not None:
                for gpu, units in entry.held.items():
                    freed[gpu] = freed.get(gpu, 0) + units
                self.released += 1
                self._drop(entry)
        waiting = sum(e.held is None for e in entries)
        self.log(
            f"client {client} gone: freed {_count(len(entries) - waiting, 'lease')}"
            + (f" ({self._what(freed)})" if freed else "")
            + f", withdrew {_count(waiting, 'waiter')}"
        )
        return out + self._deliver(self.core.release_many(freed.items(), now=now), now)
