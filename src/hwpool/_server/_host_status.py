"""The host server's ``status``: free units, leases by id, the queue in order with why each
waiter is held, and every owner's share and usage, as a given uid may see them. The records
are built as they are read (:class:`Built`), so a long answer costs one line at a time."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar, overload

from .._core._explain import Explanation, Reason
from .._core._limits import LimitHold
from .._wire._protocol import (
    MAX_OWNERS,
    AccountRecord,
    LeaseRecord,
    OwnerRecord,
    StatusReply,
    WaiterRecord,
)
from ._host_admission import _limit_words, _who
from ._host_drain import _HostDrain
from ._host_entries import Client, Entry
from ._waits import HeldLease, describe_units, explain_waiters

__all__ = ["NO_REASON", "Built"]

NO_REASON = "nothing new starts until an admin runs `hwpool resume`"
"""A waiter's detail while the server is drained with no reason given."""


class _HostStatus(_HostDrain):
    """The status answer (see the module)."""

    def status(
        self,
        req: int,
        now: float,
        started: float,
        viewer: int | None = None,
        *,
        wall_offset: float = 0.0,
    ) -> StatusReply:
        """The whole host as uid ``viewer`` may see it: free units, leases by id, the queue in
        order (held-back ones last). Command lines may hold secrets: ``viewer`` sees those of
        its own requests, an admin every one (None: the server's own view, all); every name
        is shown to all.

        What changes (held amounts, ages, reservations) is taken now, in one step; the records
        are built as they are read (:class:`Built`), so a long answer sent a line at a time
        costs the loop one line's records per turn.

        Each waiter says why it waits and when it should start (:mod:`._waits`), the start on
        this state's clock plus ``wall_offset`` (the server's: the wall clock's lead on it).
        """
        admin = viewer is None or viewer in self.admins

        def command(e: Entry) -> str | None:
            return e.command if admin or e.client.uid == viewer else None

        def lease(item: tuple[Entry, tuple[tuple[int, int], ...], float]) -> LeaseRecord:
            e, held, age = item
            return LeaseRecord(e.id, e.client.uid, e.client.pid, held, age, e.name, command(e))

        def waiter(item: tuple[Entry, tuple[int, ...], float, LimitHold | None]) -> WaiterRecord:
            e, reserved, age, held = item
            count, units, unit = self._wire_demand(e.demand)
            account = self.account_of.get(e.client.uid)
            why = waits.get(e.ticket) if e.ticket is not None else None
            reason, detail, start = (
                (why.reason.value, why.detail, why.start) if why is not None
                else (Reason.HELD.value, "held back until the server's recovery ends", None)
            )  # fmt: skip
            return WaiterRecord(
                e.id, e.client.uid, e.client.pid, count, units, reserved, age, e.name,
                command(e), unit, None if held is None else _held_text(e.client, account, held),
                account, reason, detail, None if start is None else start + wall_offset,
            )  # fmt: skip

        leases = [
            (e, tuple(sorted(e.held.items())), now - e.since)
            for e in sorted(self._by_id.values(), key=lambda e: e.id)
            if e.held is not None
        ]
        waiting: list[tuple[Entry, tuple[int, ...], float, LimitHold | None]] = [
            (entry, w.reserved, now - entry.since, w.held)
            for w in self.core.waiters()
            for entry in [self._by_ticket[w.ticket]]
        ]
        waits = self._explained(waiting, now)
        waiting += [
            (e, (), now - e.since, None) for e in sorted(self._held_back, key=lambda e: e.id)
        ]
        left = 0.0 if self.recovery is None else max(0.0, self.recovery.deadline - now)
        records = self._owners([item[0].demand.owner for item in waiting], now)
        shown, left_out = records[:MAX_OWNERS], max(0, len(records) - MAX_OWNERS)
        free = tuple(max(0, f) for f in self.core.free)  # below 0 where memory is withheld
        return StatusReply(
            req, free, Built(leases, lease), Built(waiting, waiter), self.granted,
            self.released, self.cancelled, self.timed_out, left, now - started,
            owners=tuple(r for r in shown if isinstance(r, OwnerRecord)), owners_left_out=left_out,
            accounts=tuple(r for r in shown if isinstance(r, AccountRecord)),
            draining=self.drained.server, drained_gpus=self.drained.gpus,
        )  # fmt: skip

    def _explained(
        self, waiting: list[tuple[Entry, tuple[int, ...], float, LimitHold | None]], now: float
    ) -> dict[int, Explanation]:
        """The core's explanation of each waiter in it, by ticket (none while nobody waits)."""
        if not waiting:
            return {}
        return self._kept_waits.get(self.changes, now, lambda: self._explain_now(waiting, now))

    def _explain_now(
        self, waiting: list[tuple[Entry, tuple[int, ...], float, LimitHold | None]], now: float
    ) -> dict[int, Explanation]:
        held = {e.granted_as: e for e in (*self.held_leases(), *self.revoked_leases())}
        leases = [
            HeldLease(ticket, e.held, e.since, e.demand, e.expected_s, e.revoked_until)
            for ticket, e in held.items()
            if ticket is not None and e.held
        ]
        hints = {e.ticket: e.expected_s for e, *_ in waiting if e.ticket and e.expected_s}
        describe = describe_units(self.totals is not None, self.units_per_gpu)
        why = self.drained.server
        outside = (
            None if why is None
            else {w.ticket: (Reason.DRAINING, why or NO_REASON) for w in self.core.waiters()}
        )  # fmt: skip
        return explain_waiters(self.core, leases, hints, now, describe, outside=outside)

    def _owners(self, waiting: list[Hashable], now: float) -> list[OwnerRecord | AccountRecord]:
        """Every owner with a lease, a waiter or a share of its own, as the core counts it (its
        share, decayed usage and GPUs held now) with its number of waiters: a uid's record or
        an account's, the busiest first (most GPUs held, then most waiting, then uids by
        number before accounts by name)."""
        queued: dict[Hashable, int] = {}
        for owner in waiting:
            queued[owner] = queued.get(owner, 0) + 1
        core = self.core
        records: list[OwnerRecord | AccountRecord] = []
        for owner in {*map(self.owner_of, self._per_uid), *self.shared_owners}:
            counts = (core.share(owner), core.usage(owner, now), core.running(owner),
                      queued.get(owner, 0))  # fmt: skip
            if isinstance(owner, str):
                records.append(AccountRecord(owner, *counts))
            else:
                records.append(OwnerRecord(owner, *counts))
        records.sort(key=_busiest)
        return records


_Item = TypeVar("_Item")


_Record = TypeVar("_Record", LeaseRecord, WaiterRecord)


class Built(Sequence[_Record]):
    """Records made from ``items`` by ``build`` when they are read (each time: read once)."""

    __slots__ = ("_build", "_items")

    def __init__(self, items: list[_Item], build: Callable[[_Item], _Record]) -> None:
        self._items: list[Any] = items
        self._build: Callable[[Any], _Record] = build

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> _Record: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[_Record, ...]: ...
    def __getitem__(self, index: int | slice) -> _Record | tuple[_Record, ...]:
        if isinstance(index, slice):
            return tuple(map(self._build, self._items[index]))
        return self._build(self._items[index])

    def __iter__(self) -> Iterator[_Record]:
        return map(self._build, self._items)


def _busiest(record: OwnerRecord | AccountRecord) -> tuple[float, int, int, int | str]:
    """The status order of owners: most running, then most queued, then uids, accounts."""
    if isinstance(record, AccountRecord):
        return (-record.running, -record.queued, 1, record.account)
    return (-record.running, -record.queued, 0, record.uid)


def _held_text(client: Client, account: str | None, held: LimitHold) -> str:
    """Why a waiter is held, for status: ``alice (uid 1000) at the limit of 2 GPUs held at
    once (has 2, needs 1 more)``; ``account ml (alice (uid 1000)) at ...`` for a member of an
    account (its limits are the account's)."""
    who = _who(client, account)
    return (
        f"{who} at the limit of {_limit_words(held.limit, held.allowed)} "
        f"(has {held.used:g}, needs {held.need:g} more)"
    )
