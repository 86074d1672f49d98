"""The host server after a restart: new grants held back while the clients the journal names
reclaim their leases and waiters (each only by the client that made it, only as journaled,
through the admission of a new lease), until all have or the deadline passes; then the
held-back waiters enter the core in their original id order."""

from __future__ import annotations

from collections.abc import Callable

from .._core._limits import LimitExceeded
from .._core._scheduler import Demand, Grant
from .._wire._protocol import ErrorCode, Granted, ProtocolError, Reclaim
from ._host_entries import Client, Delivery, Recovery, _made_by, _pairs
from ._host_revokes import _HostRevokes
from ._journal import Journal, JournalEntry


class _HostRecovery(_HostRevokes):
    """Recovery and ``reclaim`` (see the module)."""

    def start_recovery(
        self,
        journal: Journal,
        now: float,
        grace_s: float,
        alive: Callable[[int], bool],
        *,
        complete: bool = True,
    ) -> None:
        """Hold new grants back for ``grace_s`` while the clients of ``journal`` reclaim.

        Requests of dead pids are dropped at once; the rest stay in the journal this state
        writes until reclaimed, so a second crash during recovery loses nothing either.
        """
        self.next_id = max(self.next_id, journal.id_limit)
        self.id_limit = self.next_id
        pending = {e.id: e for e in journal.entries if alive(e.pid)}
        self.recovery = Recovery(now + grace_s, pending, complete)
        pids = {e.pid for e in journal.entries}
        self.log(
            f"recovering: {len(journal.entries)} journaled leases and waiters of {len(pids)} "
            f"clients, {len(journal.entries) - len(pending)} of dead ones freed; nothing new "
            f"is granted for up to {grace_s:g} s while the others reclaim"
        )

    def reclaim(self, client: Client, msg: Reclaim, now: float) -> list[Delivery]:
        """A reconnected client re-declares lease or waiter ``msg.id`` under ``msg.req``.

        A lease is taken back only as the journal names it (``lost`` otherwise, naming the
        id): by the client that made it (else ``forbidden``), as journaled, during recovery
        or, for one recovery ended without, after it. With an unreadable journal, a lease is
        taken back during recovery as the client says. Either way it goes through the
        admission a new lease goes through: the caps on requests and its owner's limits
        (``limit``: a lease that is held cannot wait), and what is free (``lost``); after
        recovery only while nobody waits. Its owner's usage counts it from its journaled
        start. A waiter is served as a new request (its journaled id kept, its place held
        during recovery).
        """
        self._data_only(client, msg.req)
        self._fresh_req(client, msg.req)
        owner = self.owner_of(client.uid)
        demand = self._demand(
            msg.count, msg.units, msg.unit, msg.req, owner=owner, limit=msg.limit_s
        )
        if msg.held is not None and len({gpu for gpu, _ in msg.held}) != len(msg.held):
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE, f"reclaim of #{msg.id}: held names a GPU twice", msg.req
            )
        journaled = self._journaled_as(client, msg, demand)
        self._room_for(client, msg.req)  # the caps on requests, as for a new one
        start = self._journaled_start(journaled, now)
        ticket = None
        if msg.held is not None:
            ticket = self._restore(client, msg.held, msg.req, start, now)
        if journaled is not None:
            self._forget_journaled(msg.id)
        ident = msg.id if journaled is not None else self._old_id(msg.id)
        since = start if start is not None else now - msg.age_s
        entry = self._add(client, msg, demand, since, ident)
        if msg.held is None:
            return [self._grant_or_queue(entry, now)]
        entry.held = dict(msg.held)
        entry.granted_as = ticket
        amounts = {units for _, units in msg.held}
        entry.units = amounts.pop() if len(amounts) == 1 else 0  # as a grant says it
        end = journaled.limit_end if journaled is not None else None
        if end is None and msg.limit_s is not None:  # not journaled: as the client counts
            end = now - msg.age_s + msg.limit_s
        if end is not None:
            self._limit_at(entry, end)
        self.log(f"reclaim #{entry.id} by {client}: {self._what(entry.held)}")
        units = max(units for _, units in msg.held)
        return [(client, Granted(msg.req, entry.id, tuple(entry.held), units))]

    def _journaled_as(self, client: Client, msg: Reclaim, demand: Demand) -> JournalEntry | None:
        """The journal entry ``msg`` takes back (pending during recovery; after it, a lease
        recovery ended without), or None where it names none and may be served as a new
        request; ProtocolError where it may not be taken back so."""
        recovery = self.recovery
        if recovery is None and msg.held is None:
            return None
        journaled = (self._late if recovery is None else recovery.pending).get(msg.id)
        if journaled is None:
            if msg.held is not None and (recovery is None or recovery.complete):
                raise ProtocolError(
                    ErrorCode.LOST,
                    f"cannot reclaim lease #{msg.id}: the journal has no such lease waiting to "
                    "be reclaimed",
                    msg.req,
                )
            return None
        if not _made_by(journaled, client):
            who = (
                f"uid {journaled.uid}"
                if journaled.uid != client.uid
                else "another client of this uid"
            )
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"#{msg.id} was journaled for {who}: only the client that made it may reclaim it",
                msg.req,
            )
        held = None if msg.held is None else tuple(sorted(msg.held))
        expected = None if journaled.held is None else tuple(sorted(journaled.held))
        if (demand.count, demand.units, held) != (journaled.count, journaled.units, expected):
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"reclaim of #{msg.id} does not match the journal: it says {demand.count} x "
                f"{demand.units} units, held {_pairs(held)}; the journal says "
                f"{journaled.count} x {journaled.units} units, held {_pairs(expected)}",
                msg.req,
            )
        return journaled

    def _journaled_start(self, journaled: JournalEntry | None, now: float) -> float | None:
        """When the lease ``journaled`` was granted, on this state's clock (never after
        ``now``), or None where the journal does not say."""
        if journaled is None or journaled.start is None:
            return None
        return min(now, journaled.start)

    def _forget_journaled(self, ident: int) -> None:
        """Journal entry ``ident`` is taken back: recovery (or the late leases) no longer
        expects it."""
        if self.recovery is not None:
            del self.recovery.pending[ident]
        else:
            del self._late[ident]

    def _old_id(self, ident: int) -> int | None:
        """``ident`` for a reclaim after recovery, if it was handed out before and nobody uses
        it; else None (a new id). During recovery ids decide the order, so none is kept."""
        if self.recovery is None and ident < self.next_id and ident not in self._by_id:
            return ident
        return None

    def _restore(
        self,
        client: Client,
        held: tuple[tuple[int, int], ...],
        req: int,
        since: float | None,
        now: float,
    ) -> int | None:
        """Take ``held`` back in the core as ``client``'s owner's, counted in its usage from
        ``since`` (None: from now), all or nothing, through the admission of a new lease: its
        owner's limits (``limit``, logged) and what is free (``lost``). The core's ticket of
        the grant, where it is one grant (held of equal units on each GPU)."""
        owner = self.owner_of(client.uid)
        try:
            self.core.check_restore(owner, dict(held))
        except LimitExceeded as exc:
            raise self._refused(client, exc, req) from None
        by_units: dict[int, list[int]] = {}
        for gpu, units in held:
            by_units.setdefault(units, []).append(gpu)
        done: list[Grant] = []
        try:
            for units, gpus in by_units.items():
                done.append(
                    self.core.restore(tuple(gpus), units, owner=owner, now=now, since=since)
                )
        except ValueError as exc:
            for grant in done:
                self.core.release_many(self.core.held(grant), ticket=grant.ticket)
            raise ProtocolError(ErrorCode.LOST, f"cannot reclaim this lease: {exc}", req) from None
        return done[0].ticket if len(done) == 1 else None

    def reclaimed(self, client: Client, now: float) -> list[Delivery]:
        """``client`` has re-declared everything: what else it journaled is gone (only its
        own: a request of another pool of the same process has another token). From a control
        connection, which reclaims nothing, it is ignored."""
        if self.recovery is None or client.control:
            return []
        pending = self.recovery.pending
        for ident in [i for i, e in pending.items() if _made_by(e, client)]:
            del pending[ident]
        return self.check_recovery(now)

    def check_recovery(
        self, now: float, alive: Callable[[int], bool] | None = None
    ) -> list[Delivery]:
        """End recovery once nothing journaled is pending (of live pids) or at the deadline."""
        recovery = self.recovery
        if recovery is None:
            return []
        if alive is not None:
            for ident in [i for i, e in recovery.pending.items() if not alive(e.pid)]:
                del recovery.pending[ident]
        if now < recovery.deadline and (recovery.pending or not recovery.complete):
            return []
        self.recovery = None
        self.changes += 1
        self._late = {i: e for i, e in recovery.pending.items() if e.held is not None}
        self.log(
            f"recovery over: {len(recovery.pending)} journaled requests not reclaimed, freed; "
            f"{len(self._held_back)} held-back waiters enter the queue in order"
        )
        held_back, self._held_back = sorted(self._held_back, key=lambda e: e.id), []
        replies: list[Delivery] = []
        for entry in held_back:
            try:
                granted = self._submit(entry, now)
            except ProtocolError as exc:  # its uid's limits refuse it now
                replies.append((entry.client, exc.reply()))
                continue
            if granted is not None:
                replies.append(granted)
        return replies
