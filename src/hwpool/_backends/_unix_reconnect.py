"""The unix backend after a lost connection: reconnect with backoff, re-declare every lease
and waiter (``reclaim``, in the original order) and every request made meanwhile, then
``reclaimed``; or, if no server comes back within ``reconnect_timeout``, fail what waits and
drop what is held."""

from __future__ import annotations

import contextlib
import logging
import time
from threading import get_ident

from .._wire._connection import Wire
from .._wire._protocol import Acquire, ClientMessage, Reclaim, Reclaimed, encode
from ._unix_link import _UnixLink
from ._unix_requests import DIAL_TIMEOUT_S, RETRY_FIRST_S, RETRY_MAX_S, _Incompatible, _State

_log = logging.getLogger("hwpool")


class _UnixReconnect(_UnixLink):
    """A lost connection: made again, or given up (see the module)."""

    def _lost(self, wire: Wire, reason: ConnectionError) -> bool:
        """The reader lost ``wire``: whether to connect again (something is held or waited
        for); status calls sent on it fail with ``reason``."""
        with self._section():
            if self._wire is not wire:
                return False  # closed, or this process forked: not ours to repair
            self._wire = None
            with contextlib.suppress(ValueError):
                self._opened.wires.remove(wire)
            wire.sock.close()
            for call in self._calls.values():
                call.error = reason
                self._to_wake.append(call)
            self._calls.clear()
            if not self._reqs:
                return False  # nothing to keep: the next request connects again
            self._reconnecting = True
            return True

    def _reconnect(self) -> Wire | None:
        """The connection thread, with no connection: dial with backoff until a server
        answers (then re-declare everything on it), nothing is left to declare, the pool is
        closed, or ``reconnect_timeout`` passes (then fail what waits, drop what is held)."""
        deadline = time.monotonic() + self._reconnect_s
        delay = RETRY_FIRST_S
        reason = ConnectionError("no attempt made")
        while self._wanted():
            try:
                new = self._dial(max(0.1, min(DIAL_TIMEOUT_S, deadline - time.monotonic())))
            except _Incompatible as exc:  # a server answered, and what is held cannot go there
                reason = exc
                break
            except ConnectionError as exc:
                reason = exc
                if time.monotonic() + delay >= deadline:
                    break
                time.sleep(delay)  # backoff between attempts, bounded by the deadline
                delay = min(2 * delay, RETRY_MAX_S)
                continue
            if self._resume(new):
                return new
            new.shutdown()
            return None
        else:
            return None
        self._give_up(reason)
        return None

    def _wanted(self) -> bool:
        """Whether the connection thread should go on dialing: not closed, and something is
        held or waited for (else it stops, and the next request starts it again)."""
        with self._section():
            if not self._closed and (self._reqs or self._calls):
                return True
            self._reconnecting = False
            return False

    def _resume(self, wire: Wire) -> bool:
        """Re-declare every lease and waiter on ``wire``, in their original order, and send
        the status calls made while there was no connection."""
        with self._send_lock:
            self._send_owner = get_ident()
            try:
                with self._section():
                    if self._closed:
                        return False
                    lines = [encode(m) for m in self._declarations()]
                    lines += [encode(c.message) for c in self._calls.values() if c.message]
                    self._outbox.clear()  # superseded by the declarations
                    self._wire, self._reconnecting = wire, False
                    self._gpus = wire.welcome.gpus
                with contextlib.suppress(OSError):
                    wire.send_bytes(b"".join(lines))
            finally:
                self._send_owner = 0
        self._pump()
        _log.info("hwpool: connected to %s; declared %d requests", self._path, len(lines) - 1)
        return True

    def _declarations(self) -> list[ClientMessage]:
        now = time.monotonic()
        out: list[ClientMessage] = []
        for r in sorted(self._reqs.values(), key=lambda r: r.key):
            count, units, unit = self._asked(r.demand)
            if r.id is None:
                out.append(
                    Acquire(r.key, count, units, r.wait, r.name, r.command, r.expected,
                            unit, r.demand.priority, r.demand.limit)
                )  # fmt: skip
            else:
                if r.asked is not None:  # taken over: re-declared as it was asked
                    count, units, unit = r.asked
                held = self._held(r) if r.state is _State.HELD else None
                age = now - r.since
                out.append(
                    Reclaim(r.key, r.id, count, units, held, age, r.name, r.command, unit,
                            r.demand.limit)
                )  # fmt: skip
        out.append(Reclaimed(next(self._keys)))
        return out

    def _give_up(self, reason: ConnectionError) -> None:
        """No server to go back to: fail every request and status call, drop the leases."""
        if isinstance(reason, _Incompatible):
            error = ConnectionError(str(reason))
        else:
            error = ConnectionError(
                f"lost the hwpool server on {str(self._path)!r} and none answered within "
                f"reconnect_timeout={self._reconnect_s:g}s ({reason})"
            )
        with self._section():
            self._reconnecting = False
            self._drop_all(error)
            for call in self._calls.values():
                call.error = error
                self._to_wake.append(call)
            self._calls.clear()
        _log.warning("hwpool: %s; leases held are dropped", error)

    def _drop_all(self, error: BaseException) -> None:
        """In a section: fail every waiting request with ``error``; held leases are dropped."""
        for r in self._reqs.values():
            if r.state is _State.HELD:
                self._orphans.add(r.key)
            else:
                r.error = error
                self._to_wake.append(r)
        self._reqs.clear()
