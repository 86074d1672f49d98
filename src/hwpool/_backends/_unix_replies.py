"""What the unix backend does with each message the server sends: a grant, a queued, a
refusal, a revocation, a hand-over's answer, a status in parts. The connection thread applies
what one read brought in one section, and the waiters it answers are woken together when the
section ends."""

from __future__ import annotations

import logging
import time

from .._core._demand import make_demand
from .._core._scheduler import Demand
from .._wire._protocol import (
    Busy,
    Done,
    ErrorReply,
    Give,
    Given,
    Granted,
    Notice,
    Queued,
    Release,
    Revoked,
    ServerMessage,
    StatusPart,
    StatusReply,
    Take,
    TakenRequest,
    join_status,
)
from ._unix_handover import _UnixHandover
from ._unix_requests import _error_for, _Req, _State, _user

_log = logging.getLogger("hwpool")


class _UnixReplies(_UnixHandover):
    """The reader's side: each server message applied to the requests (see the module)."""

    def _dispatch(self, messages: list[ServerMessage]) -> None:
        """Apply ``messages`` (what one read brought) in one section: their waiters are woken
        together when it ends."""
        with self._section():
            for message in messages:
                self._apply(message)

    def _apply(self, message: ServerMessage) -> None:
        """In a section: what one server message changes."""
        match message:
            case Granted() if message.req in self._calls:  # the answer to a take
                self._on_taken(message)
            case Granted():
                self._on_granted(message)
            case Given():
                self._on_given(message)
            case Queued():
                r = self._reqs.get(message.req)
                if r is not None:
                    r.id = message.id
                    if r.state is _State.SENT:
                        r.state = _State.QUEUED
            case Busy():
                r = self._reqs.pop(message.req, None)
                if r is not None:
                    self._to_wake.append(r)
            case ErrorReply():
                self._on_error(message)
            case Revoked():
                self._on_revoked(message)
            case Notice():
                _log.warning("%s", message.text)  # on the job's stderr (hwpool run, a job)
            case StatusPart():
                call = self._calls.get(message.req)
                if call is not None:
                    call.parts.append(message)
            case StatusReply():
                call = self._calls.pop(message.req, None)
                if call is not None:
                    call.reply = join_status(call.parts, message)
                    self._to_wake.append(call)
            case Done():
                call = self._calls.pop(message.req, None)
                if call is not None:
                    call.reply = message
                    self._to_wake.append(call)

    def _on_granted(self, message: Granted) -> None:
        r = self._reqs.get(message.req)
        if r is None:
            if message.request is not None:  # a take whose caller stopped waiting: give it back
                self._post(Release(next(self._keys), message.req))
            return  # withdrawn on the way: the withdraw gives it back
        r.id = message.id
        if r.state is _State.HELD:
            return  # a reclaimed lease, confirmed
        r.state, r.gpus, r.since = _State.HELD, message.gpus, time.monotonic()
        r.units = message.units
        self._granted += 1
        self._to_wake.append(r)

    def _on_taken(self, message: Granted) -> None:
        """A lease taken over (the answer to a ``take``): from now on it is this backend's,
        held under the take's key, as if it had been granted here."""
        call = self._calls.pop(message.req)
        request = message.request or TakenRequest(len(message.gpus), message.units, 0.0)
        demand = _taken_demand(request, self._totals)
        r = _Req(message.req, demand, True, None, name=request.name, command=request.command)
        r.asked = (request.count, request.units, request.unit)
        r.state, r.id, r.gpus, r.units = _State.HELD, message.id, message.gpus, message.units
        r.since = time.monotonic() - request.age_s
        self._reqs[r.key] = r
        self._granted += 1
        call.reply = message
        self._to_wake.append(call)

    def _on_given(self, message: Given) -> None:
        """The lease a ``give`` offered may now be taken: forget it at once (this backend
        never releases or re-declares it again)."""
        call = self._calls.pop(message.req, None)
        if call is None:
            return
        r = None if call.giving is None else self._reqs.get(call.giving)
        if r is not None and r.id == message.id:
            del self._reqs[r.key]
            self._handed[r.key] = message.id
            self._released += 1  # no longer held here: granted - released stays what is held
        call.reply = message
        self._to_wake.append(call)

    def _on_error(self, message: ErrorReply) -> None:
        if message.req is None:
            _log.info("hwpool: the server on %s says: %s", self._path, message.message)
            return
        call = self._calls.pop(message.req, None)
        if call is not None:
            if isinstance(call.message, Give | Take):
                call.error = self._handover_error(call.message, message)
            else:
                call.error = ConnectionError(message.message)
            self._to_wake.append(call)
        r = self._reqs.pop(message.req, None)
        if r is None:
            return
        if r.state is _State.HELD:  # a reclaim the new server could not take
            self._orphans.add(r.key)
            self._released += 1
            _log.warning(
                "hwpool: lease #%s on GPUs %s is lost after a server restart: %s",
                r.id, list(r.gpus), message.message,
            )  # fmt: skip
            return
        r.error = _error_for(message)
        self._to_wake.append(r)

    def _on_revoked(self, message: Revoked) -> None:
        r = self._reqs.get(message.req)
        if r is None:
            return
        if message.reason == "overuse":  # known before the lease reads as not held
            self._overuse_keys.add(r.key)
        del self._reqs[message.req]
        self._orphans.add(r.key)
        self._released += 1
        if message.reason == "overuse":
            _log.warning(
                "hwpool: lease #%s on GPUs %s was ended for overuse: its processes used more GPU "
                "memory than it was leased; its release is a no-op",
                message.id, list(r.gpus),
            )  # fmt: skip
            return
        if message.reason == "limit":
            self._revoked_count += 1
            self._timed_out_keys.add(r.key)
            _log.info(
                "hwpool: lease #%s on GPUs %s was revoked: its time limit (%g s) ran out; its "
                "release is a no-op",
                message.id, list(r.gpus), r.demand.limit or 0.0,
            )  # fmt: skip
            return
        _log.warning(
            "hwpool: lease #%s on GPUs %s was revoked by %s (hwpool cancel): the server may "
            "grant those GPUs to others now, and its release is a no-op",
            message.id, list(r.gpus), _user(message.by),
        )  # fmt: skip


def _taken_demand(request: TakenRequest, totals: tuple[int, ...] | None) -> Demand:
    """The demand of a lease taken over, from what its ``acquire`` asked (``request``), as a
    GPUPool of this server (``totals``: sized in memory) would have made it."""
    if request.unit == "mib":
        return make_demand(memory=request.units, totals=totals, limit=request.limit_s)
    return make_demand(
        count=request.count, units=request.units, totals=totals,
        limit=request.limit_s, keep_shares=True,
    )  # fmt: skip
