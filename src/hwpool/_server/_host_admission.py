"""Admission on the host server: a request becomes the core's demand (checked against the
host: its GPUs, MIG, memory or fractions), within the caps on requests per connection and
per uid and its owner's limits (refused with ``limit``, logged), then granted or queued."""

from __future__ import annotations

from dataclasses import replace

from .._core._demand import make_demand
from .._core._limits import LimitExceeded, describe_limit
from .._core._scheduler import Demand
from .._wire._protocol import ErrorCode, ProtocolError, Queued, Unit
from ._config import Owner
from ._host_books import _HostBooks
from ._host_entries import Client, Delivery, Entry, _bad, _job


class _HostAdmission(_HostBooks):
    """What a new request goes through before it is granted or waits (see the module)."""

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
            return make_demand(memory=units, totals=totals, owner=owner, priority=priority)
        full = self.units_per_gpu
        if units > full or (count > 1 and units != full):
            raise _bad(
                f"units={units} for count={count}: a GPU has {full} units and several GPUs are "
                "granted whole",
                req,
            )
        return make_demand(
            count=count, units=units, totals=totals, num_gpus=core.num_gpus,
            units_per_gpu=full, owner=owner, priority=priority, keep_shares=True,
        )  # fmt: skip

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


def _limit_words(limit: str, value: float) -> str:
    """A limit in words, where units are MiB (the server limits units only when sized in
    memory)."""
    return f"{value:g} MiB held at once" if limit == "units" else describe_limit(limit, value)


def _who(client: Client, account: str | None) -> str:
    """``alice (uid 1000)``, or ``account ml (alice (uid 1000))`` for a member of one: whose
    limits these are."""
    user = client.user or f"uid {client.uid}"
    return user if account is None else f"account {account} ({user})"
