"""The host server's books: who holds and who waits for what, over one scheduler core.

Every entry is found by id, by its core ticket while it waits, and counted per uid; each
change is noted for the journal (:meth:`journal_changes`), whose whole state
:meth:`journal` also gives. Ids are handed out in blocks whose end is journaled first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any

from .._core._capacity import UNITS_PER_GPU
from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._limits import OwnerLimits
from .._core._scheduler import Demand, Grant, Scheduler
from .._wire._protocol import Acquire, Granted, Reclaim, Unit, request_for
from ._config import Owner
from ._defaults import (
    HANDOVER_S,
    MAX_REQUESTS_PER_CONNECTION,
    MAX_REQUESTS_PER_USER,
    REVOKED_HOLD_S,
)
from ._drain_file import Drained
from ._host_entries import ID_BLOCK, Client, Delivery, Entry, Recovery, _job, _journaled, _no_log
from ._journal import Counters, Journal, JournalEntry
from ._waits import Kept


class _HostBooks:
    """The host server's books over the scheduler core: every request by id, by core ticket
    and per uid, what changed since the journal last wrote, the counters; how an entry is
    added, granted, dropped and removed. The parts above it add admission, time limits and
    revocations, recovery, status and the requests themselves (see :class:`HostState`)."""

    def __init__(
        self,
        num_gpus: int,
        *,
        units_per_gpu: int = UNITS_PER_GPU,
        totals: Sequence[int] | None = None,
        mig: bool = False,
        admins: Iterable[int] = (0,),
        first_id: int = 1,
        log: Callable[[str], None] = _no_log,
        policy: str = "easy",
        max_per_connection: int = MAX_REQUESTS_PER_CONNECTION,
        max_per_user: int = MAX_REQUESTS_PER_USER,
        shares: Mapping[Owner, float] | None = None,
        half_life: float = DEFAULT_HALF_LIFE,
        limits: Mapping[Owner, OwnerLimits] | None = None,
        default_limits: OwnerLimits | None = None,
        accounts: Mapping[str, Collection[int]] | None = None,
        memory_groups: Sequence[Hashable | None] | None = None,
    ) -> None:
        if totals is not None and len(totals) != num_gpus:
            raise ValueError(f"totals must give {num_gpus} GPUs, got {list(totals)}")
        for name, cap in (("max_per_connection", max_per_connection),
                          ("max_per_user", max_per_user)):  # fmt: skip
            if type(cap) is not int or cap < 1:
                raise ValueError(f"{name} must be an int >= 1, got {cap!r}")
        self.account_of = _account_of(accounts or {})  # uid -> the account it is scheduled in
        per_owner: dict[Hashable, float] = {o: share for o, share in (shares or {}).items()}
        self.shared_owners = tuple(shares or {})  # the owners with a share of their own
        per_owner_limits: dict[Hashable, OwnerLimits] = {
            owner: lim for owner, lim in (limits or {}).items()
        }
        fair: dict[str, Any] = {
            "policy": policy, "shares": per_owner, "half_life": half_life,
            "limits": per_owner_limits, "default_limits": default_limits,
            "memory_groups": memory_groups,  # MIG devices of one GPU instance (rule 13)
        }  # fmt: skip
        if totals is None:
            self.core = Scheduler(num_gpus, units_per_gpu, **fair)
        else:
            self.core = Scheduler(totals, **fair)
        self.totals = None if totals is None else self.core.totals
        # What a whole GPU is in a request that asks for a share of one (unit "gpu").
        self.units_per_gpu = self.core.units_per_gpu if totals is None else UNITS_PER_GPU
        self.mig = mig
        self.admins = frozenset(admins)
        self.log = log
        self.next_id = first_id
        self.id_limit = first_id  # ids below this are journaled as used
        self.changes = 0  # bumped on every change worth journaling
        self._dirty: set[int] = set()  # ids whose journal record changed: journal_changes()
        self.recovery: Recovery | None = None
        # Journaled leases recovery ended without (their client came back too late): only
        # those may still be reclaimed after it, by their client, within its owner's limits.
        self._late: dict[int, JournalEntry] = {}
        self._by_id: dict[int, Entry] = {}
        self._by_ticket: dict[int, Entry] = {}
        self._held_back: list[Entry] = []
        self._kept_waits = Kept()  # the queue's last explanation (status), while unchanged
        self.drained = Drained()  # what an admin drained (see _host_drain)
        self._outside = [0] * num_gpus  # units the GPU watch withholds per GPU (_host_drain)
        self.max_per_connection = max_per_connection
        self.max_per_user = max_per_user
        self._per_uid: dict[int, int] = {}  # requests (leases and waiters) per uid
        # Leases with a time limit: (end, id), the earliest first (stale ones skipped).
        self._ends: list[tuple[float, int]] = []
        self._revoked: dict[int, Entry] = {}  # revoked leases whose GPUs are still held
        self.revoked_hold_s = REVOKED_HOLD_S
        self._offered: dict[int, Entry] = {}  # leases offered for hand-over (stale ones too)
        self.handover_s = HANDOVER_S
        # Whether a client's job still runs (its processes are not gone): asked at the end of
        # a revoked lease's hold. The server reads /proc; by default, no job is known to run.
        self.job_runs: Callable[[Client], bool] = lambda client: False
        self.granted = self.released = self.cancelled = self.timed_out = 0
        # Told of every grant: the owner, the request (count, units, unit), seconds waited.
        self.on_grant: Callable[[Owner, tuple[int, int, Unit], float], None] | None = None

    def owner_of(self, uid: int) -> Owner:
        """Whom the core serves a request of ``uid`` as: its account, or itself."""
        return self.account_of.get(uid, uid)

    def _new_id(self) -> int:
        ident = self.next_id
        self.next_id += 1
        if ident >= self.id_limit:
            self.id_limit = ident + ID_BLOCK  # the I/O layer journals this before replying
        return ident

    def _wire_demand(self, demand: Demand) -> tuple[int, int, Unit]:
        """``count``, ``units`` and ``unit`` as a request would ask for ``demand``."""
        return request_for(demand, self.totals is not None, self.units_per_gpu)

    def _add(
        self, client: Client, msg: Acquire | Reclaim, demand: Demand, since: float,
        ident: int | None = None,
    ) -> Entry:  # fmt: skip
        entry = Entry(
            ident or self._new_id(), client, msg.req, demand, since, msg.name, msg.command
        )
        if isinstance(msg, Acquire):
            entry.expected_s = msg.expected_s
        client.entries[msg.req] = entry
        self._by_id[entry.id] = entry
        self._per_uid[client.uid] = self._per_uid.get(client.uid, 0) + 1
        self._touch(entry)
        return entry

    def _drop(self, entry: Entry) -> None:
        entry.handover = None  # a ticket dies with its lease
        uid = entry.client.uid
        del entry.client.entries[entry.req]
        del self._by_id[entry.id]
        left = self._per_uid[uid] - 1
        if left:
            self._per_uid[uid] = left
        else:
            del self._per_uid[uid]
        self._touch(entry)

    def _touch(self, entry: Entry) -> None:
        """``entry`` changed (added, granted, released in part, gone): journal it anew."""
        self.changes += 1
        self._dirty.add(entry.id)

    def _granted(self, entry: Entry, grant: Grant, now: float) -> Delivery:
        waited = now - entry.since
        entry.held = dict(self.core.held(grant))
        entry.units = grant.units
        entry.ticket = None
        entry.granted_as = grant.ticket
        entry.since = now
        self.granted += 1
        limit = entry.demand.limit
        if limit is not None:
            self._limit_at(entry, now + limit)
        self._touch(entry)
        if self.on_grant is not None:
            self.on_grant(self.owner_of(entry.client.uid), self._wire_demand(entry.demand), waited)
        self.log(
            f"grant {_job(entry)} to {entry.client}: {self._what(entry.held)}"
            + (f" after {waited:.3f} s" if waited > 0.0005 else "")
        )
        return (entry.client, Granted(entry.req, entry.id, grant.gpus, grant.units))

    def _limit_at(self, entry: Entry, end: float) -> None:
        """Revoke lease ``entry`` at ``end`` (``expire``), unless it is gone by then."""
        entry.limit_end = end
        heapq.heappush(self._ends, (end, entry.id))

    def _deliver(self, grants: list[Grant], now: float) -> list[Delivery]:
        return [self._granted(self._by_ticket.pop(g.ticket), g, now) for g in grants]

    def _remove(self, entry: Entry, now: float) -> list[Delivery]:
        """Drop ``entry`` from the host: cancel it in the core or give back what it holds."""
        self._drop(entry)
        if entry.held is not None:
            self.released += 1
            grants = self.core.release_many(entry.held.items(), ticket=entry.granted_as, now=now)
            return self._deliver(grants, now)
        if entry.ticket is not None:
            del self._by_ticket[entry.ticket]
            return self._deliver(self.core.cancel(entry.ticket, now=now), now)
        self._held_back.remove(entry)
        return []

    def journal(self) -> Journal:
        """What a restarted server needs: the id limit, every lease, the queue in order.

        During recovery, what is journaled but not reclaimed yet is kept.
        """
        held = [e for e in sorted(self._by_id.values(), key=lambda e: e.id) if e.held is not None]
        queue = [self._by_ticket[w.ticket] for w in self.core.waiters()]
        queue += sorted(self._held_back, key=lambda e: e.id)
        entries = [_journaled(e) for e in (*held, *queue)]
        if self.recovery is not None:
            entries += self.recovery.pending.values()
        return Journal(self.id_limit, tuple(entries), self.counters())

    def journal_changes(self) -> dict[int, JournalEntry | None]:
        """What changed since the last call, by id: the entry as it is now, None if gone.

        (What recovery still expects is not among them: the I/O layer keeps what it loaded
        until recovery is over, then asks :meth:`has_id` which of it is gone.)
        """
        dirty, self._dirty = self._dirty, set()
        by_id = self._by_id
        return {i: None if i not in by_id else _journaled(by_id[i]) for i in dirty}

    def has_id(self, ident: int) -> bool:
        """Whether lease or waiter ``ident`` is here."""
        return ident in self._by_id

    def counters(self) -> Counters:
        """The counters, for the journal (they go on across restarts)."""
        return Counters(self.granted, self.released, self.cancelled, self.timed_out)

    def restore_counters(self, counters: Counters) -> None:
        """Go on from ``counters`` (a previous server's, from its journal)."""
        self.granted, self.released, self.cancelled, self.timed_out = counters

    def _what(self, parts: dict[int, int]) -> str:
        """``0.5 of GPU 1``, ``6144 MiB of GPU 1`` or ``GPUs 0, 1``: what ``gpu -> units``
        amounts to, for the log."""
        totals = self.core.totals
        if len(parts) == 1:  # the common case, written directly (one per grant and release)
            ((gpu, units),) = parts.items()
            if units == totals[gpu]:
                return f"GPU {gpu}"
            if self.totals is not None:
                return f"{units} MiB of GPU {gpu}"
            return f"{units / self.units_per_gpu:g} of GPU {gpu}"
        if all(u == totals[g] for g, u in parts.items()):
            gpus = ", ".join(str(g) for g in sorted(parts))
            return f"GPU {gpus}" if len(parts) == 1 else f"GPUs {gpus}"
        if self.totals is not None:
            return ", ".join(f"{u} MiB of GPU {g}" for g, u in sorted(parts.items()))
        full = self.units_per_gpu
        return ", ".join(f"{u / full:g} of GPU {g}" for g, u in sorted(parts.items()))

    def _asked(self, demand: Demand) -> str:
        """``2 whole GPUs``, ``0.5 of a GPU`` or ``6144 MiB``: what ``demand`` asks, for the log."""
        count, units, unit = self._wire_demand(demand)
        full = self.units_per_gpu
        if unit == "mib":
            return f"{units} MiB"
        if count > 1 or units == full:
            return f"{count} whole GPU{'s' if count > 1 else ''}"
        return f"{units / full:g} of a GPU"


def _account_of(accounts: Mapping[str, Collection[int]]) -> dict[int, str]:
    """uid -> its account; ValueError for a uid in two accounts or a name not a str."""
    account_of: dict[int, str] = {}
    for name, members in accounts.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"an account's name must be a non-empty str, got {name!r}")
        for uid in members:
            other = account_of.setdefault(uid, name)
            if other != name:
                raise ValueError(f"uid {uid} is in accounts {other!r} and {name!r}")
    return account_of
