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
"""

from __future__ import annotations

import heapq
import hmac
import secrets
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, overload

from .._core._capacity import UNITS_PER_GPU
from .._core._explain import Explanation, Reason
from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._limits import LimitExceeded, LimitHold, OwnerLimits, describe_limit
from .._core._scheduler import Demand, Grant, Scheduler
from .._host._procs import ProcessId
from .._printable import printable
from .._wire._protocol import (
    MAX_OWNERS,
    AccountRecord,
    Acquire,
    Busy,
    Cancel,
    Done,
    ErrorCode,
    ErrorReply,
    Give,
    Given,
    Granted,
    LeaseRecord,
    OwnerRecord,
    ProtocolError,
    Queued,
    Reclaim,
    Release,
    Revoked,
    ServerMessage,
    StatusReply,
    Take,
    TakenRequest,
    Unit,
    WaiterRecord,
    Withdraw,
    request_for,
)
from ._config import Owner
from ._defaults import (
    HANDOVER_S,
    MAX_REQUESTS_PER_CONNECTION,
    MAX_REQUESTS_PER_USER,
    REVOKED_HOLD_S,
    REVOKED_RECHECK_S,
)
from ._journal import Counters, Journal, JournalEntry
from ._waits import HeldLease, Kept, describe_units, explain_waiters

__all__ = [
    "ID_BLOCK",
    "MAX_REQUESTS_PER_CONNECTION",
    "MAX_REQUESTS_PER_USER",
    "Built",
    "Client",
    "Delivery",
    "Entry",
    "HostState",
    "Recovery",
]

_Item = TypeVar("_Item")
_Record = TypeVar("_Record", LeaseRecord, WaiterRecord)

ID_BLOCK = 1024
"""Ids are handed out in blocks whose end is journaled first, so none is reused after a crash."""


@dataclass(eq=False)
class Client:
    """One connection: the peer's kernel-given identity and its requests by ``req``.

    ``token`` is what its hello said to name the client across reconnects ("" if nothing);
    a ``control`` connection (hello role ``control``) may not acquire or reclaim. ``user``
    names the uid for the log (``alice (uid 1000)``; the I/O layer looks it up).
    """

    number: int
    uid: int
    pid: int
    entries: dict[int, Entry] = field(default_factory=dict)
    token: str = ""
    control: bool = False
    user: str = ""
    notices: bool = False  # its hello said it reads ``notice`` messages
    start: int | None = None  # the pid's start time when the connection was accepted

    def __str__(self) -> str:
        return f"{self.user or f'uid {self.uid}'} pid {self.pid}"

    @property
    def holder(self) -> ProcessId | None:
        """The process that connected, as recorded when the server accepted it (its pid,
        start time and uid); None when its start time could not be read."""
        return None if self.start is None else ProcessId(self.pid, self.start, self.uid)


@dataclass(eq=False)
class Entry:
    """One request of a client: waiting (``held is None``) or granted (``held``: gpu -> units).

    ``ticket`` is its core ticket while it waits in the core; ``None`` while it is held back
    during recovery, or once granted.
    """

    id: int
    client: Client
    req: int
    demand: Demand
    since: float
    name: str | None = None
    command: str | None = None
    ticket: int | None = None
    held: dict[int, int] | None = None
    granted_as: int | None = None  # the core's ticket of its grant, for learning hold times
    expected_s: float | None = None  # the client's hint of its hold time
    limit_end: float | None = None  # a lease with a time limit: when the server revokes it
    units: int = 0  # a lease's units on each GPU, as its grant said (0: whole GPUs, mixed)
    partial: bool = False  # a lease partly released: it cannot be handed over
    handover: str | None = None  # the ticket that takes this lease over (``give``), or None
    offered_until: float = 0.0  # while offered: when the offer is withdrawn, the lease released
    revoked_until: float | None = None  # revoked: when its GPUs go back at the latest


Delivery = tuple[Client, ServerMessage]


def _job(entry: Entry) -> str:
    """``#12 "train"``: a request's id and, if it has one, its name (escaped), for the log."""
    return f"#{entry.id}" if entry.name is None else f'#{entry.id} "{printable(entry.name)}"'


@dataclass
class Recovery:
    """The grace period after a restart: until ``deadline``, for what ``pending`` names."""

    deadline: float
    pending: dict[int, JournalEntry]  # journaled requests of live pids, not reclaimed yet
    complete: bool = True  # False when the journal was unreadable: only the deadline ends it


def _no_log(line: str) -> None:
    pass


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _journaled(entry: Entry) -> JournalEntry:
    """``entry`` as the journal has it (a lease with its start and time limit's end, on the
    state's clock: ``time.monotonic()`` in the server)."""
    held = None if entry.held is None else tuple(sorted(entry.held.items()))
    c = entry.client
    demand = entry.demand
    end = entry.limit_end if entry.held is not None else None
    start = None if entry.held is None else entry.since
    return JournalEntry(
        entry.id, c.uid, c.pid, demand.count, demand.units, held, c.token, end, start
    )


def _made_by(journaled: JournalEntry, client: Client) -> bool:
    """Whether ``client`` is the one that made ``journaled``: the same uid, and the same token
    (the same pid where the entry has no token)."""
    if journaled.uid != client.uid:
        return False
    if journaled.token:
        return journaled.token == client.token
    return journaled.pid == client.pid


class HostState:
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

    # ----------------------------------------------------------------- ids and checks
    def owner_of(self, uid: int) -> Owner:
        """Whom the core serves a request of ``uid`` as: its account, or itself."""
        return self.account_of.get(uid, uid)

    def _new_id(self) -> int:
        ident = self.next_id
        self.next_id += 1
        if ident >= self.id_limit:
            self.id_limit = ident + ID_BLOCK  # the I/O layer journals this before replying
        return ident

    def _demand(
        self,
        count: int,
        units: int,
        unit: Unit,
        req: int,
        *,
        owner: Owner,
        priority: int = 0,
        limit: float | None = None,
    ) -> Demand:
        """The core's demand for a request's ``count``, ``units`` and ``unit`` (checked), of
        ``owner`` (the client's uid or account: a client never names it) at ``priority``, with
        the time limit ``limit`` (seconds) that this server enforces."""
        demand = self._sized_demand(count, units, unit, req, owner=owner, priority=priority)
        return demand if limit is None else replace(demand, limit=limit)

    def _sized_demand(
        self, count: int, units: int, unit: Unit, req: int, *, owner: Owner, priority: int = 0
    ) -> Demand:
        """:meth:`_demand` without a limit."""
        core, totals = self.core, self.totals
        if count > core.num_gpus:
            raise _bad(f"count={count} but this host has {core.num_gpus} GPUs", req)
        if count > 1 and self.mig:
            raise _bad(
                f"count={count}: this host's GPUs are MIG instances, and a CUDA process can use "
                "only one MIG instance",
                req,
            )
        if unit == "mib":
            if totals is None:
                raise _bad(
                    f"{units} MiB: this server shares fractions of a GPU, not memory (start it "
                    "with --memory or --gpu-memory to ask for memory)",
                    req,
                )
            if count > 1 or units > max(totals):
                raise _bad(
                    f"{units} MiB on {count} GPU(s): a memory request is for one GPU, and the "
                    f"largest GPU of this host has {max(totals)} MiB",
                    req,
                )
            return Demand(1, units, owner=owner, priority=priority)
        full = self.units_per_gpu
        if units > full or (count > 1 and units != full):
            raise _bad(
                f"units={units} for count={count}: a GPU has {full} units and several GPUs are "
                "granted whole",
                req,
            )
        if totals is None:
            return Demand(count, units, owner=owner, priority=priority)
        if units == full:
            return Demand(count, max(totals), whole=True, owner=owner, priority=priority)
        return Demand(1, units, relative=True, owner=owner, priority=priority)

    def _wire_demand(self, demand: Demand) -> tuple[int, int, Unit]:
        """``count``, ``units`` and ``unit`` as a request would ask for ``demand``."""
        return request_for(demand, self.totals is not None, self.units_per_gpu)

    @staticmethod
    def _fresh_req(client: Client, req: int) -> None:
        if req in client.entries:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"req {req} is already in use", req)

    @staticmethod
    def _data_only(client: Client, req: int) -> None:
        if client.control:
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                "this is a control connection (hello role 'control'): it may ask for status "
                "and cancel, not for GPUs",
                req,
            )

    def _room_for(self, client: Client, req: int) -> None:
        """Refuse (``limit``) a new request of ``client`` past a cap on requests."""
        mine = len(client.entries)
        if mine >= self.max_per_connection:
            raise ProtocolError(
                ErrorCode.LIMIT,
                f"this connection already has {mine} requests (leases and waiters), the cap "
                f"per connection (max-requests-per-connection {self.max_per_connection}); "
                "release or withdraw some first",
                req,
            )
        theirs = self._per_uid.get(client.uid, 0)
        if theirs >= self.max_per_user:
            raise ProtocolError(
                ErrorCode.LIMIT,
                f"uid {client.uid} already has {theirs} requests (leases and waiters) on this "
                f"server, the cap per user (max-requests-per-user {self.max_per_user}); "
                "release or withdraw some first",
                req,
            )

    def _refused(self, client: Client, exc: LimitExceeded, req: int) -> ProtocolError:
        """The ``limit`` error for a request of ``client`` its owner's limits refuse (logged)."""
        who = _who(client, self.account_of.get(client.uid))
        key = "memory" if exc.limit == "units" else exc.limit  # units are MiB here
        text = (
            f"{who} is limited to {_limit_words(exc.limit, exc.allowed)} on this server "
            f"({key} = {exc.allowed:g} in its [limits]); {exc.why}"
        )
        self.log(f"refuse a request of {client}: {text}")
        return ProtocolError(ErrorCode.LIMIT, text, req)

    def _entry(self, client: Client, req: int, of: int) -> Entry:
        entry = client.entries.get(of)
        if entry is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no request {of} on this connection", req)
        return entry

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

    def _grant_or_queue(self, entry: Entry, now: float) -> Delivery:
        """Grant ``entry`` at once or queue it (held back during recovery); the reply."""
        if self.recovery is not None:
            self._held_back.append(entry)
        else:
            granted = self._submit(entry, now)
            if granted is not None:
                return granted
        held_back = " (held back while recovering)" if self.recovery is not None else ""
        self.log(f"wait {_job(entry)} of {entry.client}: {self._asked(entry.demand)}{held_back}")
        return (entry.client, Queued(entry.req, entry.id))

    def _submit(self, entry: Entry, now: float) -> Delivery | None:
        """Put ``entry`` in the core: its grant if granted at once, else None (it waits).
        ProtocolError ``limit``, with ``entry`` dropped, where its uid's limits refuse it."""
        try:
            ticket, grant = self.core.submit(entry.demand, now=now, expected=entry.expected_s)
        except LimitExceeded as exc:
            self._drop(entry)
            raise self._refused(entry.client, exc, entry.req) from None
        if grant is not None:
            return self._granted(entry, grant, now)
        entry.ticket = ticket
        self._by_ticket[ticket] = entry
        return None

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

    def next_limit_end(self) -> float | None:
        """When the earliest time limit of a lease held now runs out (None: no lease has
        one); the I/O layer calls :meth:`expire` then."""
        ends, by_id = self._ends, self._by_id
        while ends:
            end, ident = ends[0]
            entry = by_id.get(ident)
            if entry is not None and entry.held is not None and entry.limit_end == end:
                return end
            heapq.heappop(ends)  # released, or its end moved (a reclaim): stale
        return None

    def expire(self, now: float) -> list[Delivery]:
        """Revoke every lease whose time limit has run out by ``now``: it is released as any
        (the journal says so), its owner is told ``revoked`` (reason ``limit``), and the
        waiters its capacity lets through are granted."""
        out: list[Delivery] = []
        while (end := self.next_limit_end()) is not None and end <= now:
            ident = heapq.heappop(self._ends)[1]
            entry = self._by_id[ident]
            held_s = now - entry.since
            self.log(
                f"revoke {_job(entry)} of {entry.client}: its time limit ran out after "
                f"{held_s:.3f} s: {self._what(entry.held or {})}"
            )
            notice = Revoked(entry.req, entry.id, entry.client.uid, "limit")
            out.append((entry.client, notice))
            out += self._hold_revoked(entry, now)
        return out + self._end_holds(now) + self._end_offers(now)

    def next_deadline(self) -> float | None:
        """When :meth:`expire` has something to do next: a time limit runs out, or a revoked
        lease's hold ends (None: nothing)."""
        ends = [e.revoked_until for e in self._revoked.values() if e.revoked_until is not None]
        ends += [e.offered_until for e in self._offered.values() if e.handover is not None]
        limit = self.next_limit_end()
        return min([*ends, *([] if limit is None else [limit])], default=None)

    def _hold_revoked(self, entry: Entry, now: float) -> list[Delivery]:
        """Lease ``entry`` was revoked: it is gone for its client and the journal; its GPUs
        stay held while a job of its holder is proven to run (see the module docstring), and
        go back at once otherwise (answered: the waiters they let through)."""
        self._drop(entry)
        self.released += 1
        if not self.job_runs(entry.client):
            self._revoked[entry.id] = entry
            return self._free_revoked(entry, now, "no job of its holder runs")
        entry.revoked_until = now + self.revoked_hold_s
        self._revoked[entry.id] = entry
        self.log(
            f"hold {self._what(entry.held or {})} of revoked {_job(entry)} until the processes "
            f"of {entry.client} are gone ({self.revoked_hold_s:g} s at most unless its job runs)"
        )
        return []

    def _end_holds(self, now: float) -> list[Delivery]:
        """Free the revoked leases whose hold has run out by ``now``, unless the job of their
        holder still runs (then ask again later)."""
        out: list[Delivery] = []
        for entry in [e for e in self._revoked.values() if (e.revoked_until or 0.0) <= now]:
            if self.job_runs(entry.client):
                entry.revoked_until = now + REVOKED_RECHECK_S
            else:
                out += self._free_revoked(entry, now, "its hold ran out, no job of it runs")
        return out

    def _end_offers(self, now: float) -> list[Delivery]:
        """Withdraw the hand-over offers nobody took by ``now`` and release their leases (the
        giver forgot them when it gave them); forget the offers taken or gone meanwhile."""
        out: list[Delivery] = []
        for entry in list(self._offered.values()):
            if entry.handover is None or entry.held is None:
                del self._offered[entry.id]  # taken, released or revoked meanwhile
            elif entry.offered_until <= now:
                del self._offered[entry.id]
                self.log(
                    f"withdraw the offer of {_job(entry)} of {entry.client}: nobody took it "
                    f"within {self.handover_s:g} s: release {self._what(entry.held)}"
                )
                out += self._remove(entry, now)
        return out

    def _free_revoked(self, entry: Entry, now: float, why: str) -> list[Delivery]:
        """Give back the GPUs of revoked lease ``entry``: the waiters they let through."""
        del self._revoked[entry.id]
        held = entry.held or {}
        self.log(f"free {self._what(held)} of revoked {_job(entry)}: {why}")
        grants = self.core.release_many(held.items(), ticket=entry.granted_as, now=now)
        return self._deliver(grants, now)

    def _deliver(self, grants: list[Grant], now: float) -> list[Delivery]:
        return [self._granted(self._by_ticket.pop(g.ticket), g, now) for g in grants]

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

    # ----------------------------------------------------------------- recovery
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

    # ----------------------------------------------------------------- the GPU watch
    def held_leases(self) -> list[Entry]:
        """The leases held now, by id (for the GPU watch's view of them)."""
        return [e for e in sorted(self._by_id.values(), key=lambda e: e.id) if e.held is not None]

    def revoked_leases(self) -> list[Entry]:
        """The revoked leases whose GPUs are still held (their processes may still run), by
        id: the GPU watch counts their processes as theirs, not outside the queue."""
        return sorted(self._revoked.values(), key=lambda e: e.id)

    def lease(self, ident: int) -> Entry | None:
        """Lease ``ident`` if it is held now."""
        entry = self._by_id.get(ident)
        return entry if entry is not None and entry.held is not None else None

    def withhold(self, gpu: int, units: int, now: float) -> list[Delivery]:
        """Withhold ``units`` of ``gpu`` from what is shared (memory used outside the queue;
        they replace what was withheld there before), granting what a smaller amount lets
        through. Not journaled: a restarted server samples the GPUs again."""
        return self._deliver(self.core.withhold(gpu, units, now=now), now)

    def end_for_overuse(self, entry: Entry, by: int, now: float) -> list[Delivery]:
        """End lease ``entry`` for using more GPU memory than it was leased: its holder is told
        ``revoked`` (reason ``overuse``, by uid ``by``: the server's), and it is released."""
        self.log(f"revoke {_job(entry)} of {entry.client}: ended for overuse: "
                 f"{self._what(entry.held or {})}")  # fmt: skip
        notice = Revoked(entry.req, entry.id, by, "overuse")
        return [(entry.client, notice), *self._hold_revoked(entry, now)]

    # ----------------------------------------------------------------- views
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
        return explain_waiters(self.core, leases, hints, now, describe)

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


def _pairs(held: tuple[tuple[int, int], ...] | None, most: int = 8) -> str:
    """``held`` for an error message (at most ``most`` pairs: a reply has a size limit)."""
    if held is None:
        return "nothing (a waiter)"
    shown = ", ".join(f"[{gpu}, {units}]" for gpu, units in held[:most])
    return f"[{shown}{', ...' if len(held) > most else ''}]"


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


def _limit_words(limit: str, value: float) -> str:
    """A limit in words, where units are MiB (the server limits units only when sized in
    memory)."""
    return f"{value:g} MiB held at once" if limit == "units" else describe_limit(limit, value)


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


def _busiest(record: OwnerRecord | AccountRecord) -> tuple[float, int, int, int | str]:
    """The status order of owners: most running, then most queued, then uids, accounts."""
    if isinstance(record, AccountRecord):
        return (-record.running, -record.queued, 1, record.account)
    return (-record.running, -record.queued, 0, record.uid)


def _who(client: Client, account: str | None) -> str:
    """``alice (uid 1000)``, or ``account ml (alice (uid 1000))`` for a member of one: whose
    limits these are."""
    user = client.user or f"uid {client.uid}"
    return user if account is None else f"account {account} ({user})"


def _held_text(client: Client, account: str | None, held: LimitHold) -> str:
    """Why a waiter is held, for status: ``alice (uid 1000) at the limit of 2 GPUs held at
    once (has 2, needs 1 more)``; ``account ml (alice (uid 1000)) at ...`` for a member of an
    account (its limits are the account's)."""
    who = _who(client, account)
    return (
        f"{who} at the limit of {_limit_words(held.limit, held.allowed)} "
        f"(has {held.used:g}, needs {held.need:g} more)"
    )


def _bad(message: str, req: int) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_REQUEST, message, req)
