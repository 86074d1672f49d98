"""Lease hand-over on the unix backend: ``give`` offers a lease to another connection of the
same user and forgets it at once (this backend never releases nor re-declares it again; the
server keeps it on this connection until it is taken, and frees it if this connection closes
first); ``take`` makes a lease given elsewhere this backend's, like one it was granted."""

from __future__ import annotations

from collections.abc import Callable

from .._check import check_int
from .._core._scheduler import Grant
from .._wire._protocol import (
    TICKET,
    ClientMessage,
    ErrorCode,
    ErrorReply,
    Give,
    Given,
    Granted,
    ServerMessage,
    Take,
)
from ._unix_reconnect import _UnixReconnect
from ._unix_requests import REPLY_TIMEOUT_S, _Call, _label, _State, _wait


class _UnixHandover(_UnixReconnect):
    """``give`` and ``take``, each one round trip (see the module)."""

    def give(self, grant: Grant) -> str:
        """Offer ``grant``'s lease to another connection of this user; its ticket (a secret:
        pass it only to the process that is to take the lease, with its id, ``lease_id``).

        Once this returns, this backend has forgotten the grant: it never releases it (its
        ``release`` raises ValueError naming it as handed over), nor re-declares it after a
        reconnect. The server keeps the lease on this backend's connection until it is taken
        (``take``), and frees it if that connection closes first (``close()``, exit), or a
        restart of the server comes first (a ticket does not survive one). Giving it again
        (before it was taken) is not possible here: it is forgotten.

        ValueError, changing nothing, for a grant this backend does not hold whole (released,
        revoked, partly released, handed over already) or that the server refuses;
        ConnectionError if the server does not answer, or knows no hand-over (older).
        """
        r = self._reqs.get(grant.ticket)
        if r is None or r.state is not _State.HELD or r.id is None:
            if grant.ticket in self._handed:
                raise ValueError(
                    f"grant {grant.ticket} (lease #{self._handed[grant.ticket]}) was handed "
                    "over already"
                )
            raise ValueError(
                f"grant {grant.ticket} (GPU(s) {list(grant.gpus)}) is not held by this pool: "
                "released, revoked or lost already, or never granted here"
            )
        if sorted(grant.gpus) != sorted(r.gpus) or grant.units != r.units:
            raise ValueError(
                f"grant {grant.ticket} names GPU(s) {list(grant.gpus)} of {grant.units} units, "
                f"but lease #{r.id} holds GPU(s) {list(r.gpus)} of {r.units} units: only a "
                "whole lease can be handed over"
            )
        reply = self._call(lambda key: Give(key, r.id or 0), giving=r.key)
        assert isinstance(reply, Given)
        return reply.ticket

    def take(
        self, lease_id: int, ticket: str, *, name: str | None = None, command: str | None = None
    ) -> Grant:
        """Become the holder of lease ``lease_id``, given (``give``) by a connection of this
        user with ``ticket``: its grant, this backend's like any other from now on (released by
        ``release``, re-declared after a reconnect, revoked at its time limit, which stays the
        one it had). ``name`` and ``command`` relabel it in ``hwpool status`` (None: this
        backend's labels, else the lease's own).

        TypeError or ValueError naming the argument for a bad ``lease_id`` or ``ticket``;
        ValueError when the server refuses (no such lease offered to this user with this
        ticket: wrong, used, its giver gone); ConnectionError if the server does not answer.
        """
        ident = check_int("lease_id", lease_id, minimum=1)
        if not isinstance(ticket, str) or not TICKET.fullmatch(ticket):
            raise ValueError(
                f"ticket must be what give() returned (16 to 64 letters, digits, '_' or '-'), "
                f"got {ticket!r:.80}"
            )
        label = self._name if name is None else _label("name", name)
        text = self._command if command is None else _label("command", command)
        reply = self._call(lambda key: Take(key, ident, ticket, label, text))
        assert isinstance(reply, Granted)
        return Grant(reply.req, reply.gpus, reply.units)

    def _call(
        self, ask: Callable[[int], ClientMessage], *, giving: int | None = None
    ) -> ServerMessage:
        """One round trip for a hand-over: ``ask(key)`` sent, its answer awaited (bounded)."""
        self._connected()
        with self._section():
            key = next(self._keys)
            message = ask(key)
            call = self._calls[key] = _Call(message, giving)
            self._send_or_connect(message)
        if not _wait(call, REPLY_TIMEOUT_S):
            with self._section():
                self._calls.pop(key, None)  # a take answered later is given back then
            raise ConnectionError(
                f"no answer to {message.op} from the hwpool server on {str(self._path)!r}"
            )
        if call.error is not None:
            raise call.error
        assert call.reply is not None
        return call.reply

    def _handover_error(self, asked: Give | Take, reply: ErrorReply) -> BaseException:
        """The error a ``give`` or ``take`` refused with ``reply`` raises."""
        if reply.code is ErrorCode.UNKNOWN_OP:
            return ConnectionError(
                f"the hwpool server on {str(self._path)!r} knows no lease hand-over ({asked.op}):"
                " it is older than this hwpool; upgrade it"
            )
        if reply.code in (ErrorCode.NOT_FOUND, ErrorCode.FORBIDDEN, ErrorCode.BAD_MESSAGE):
            return ValueError(f"the hwpool server refused the {asked.op}: {reply.message}")
        return ConnectionError(f"the hwpool server refused the {asked.op}: {reply.message}")
