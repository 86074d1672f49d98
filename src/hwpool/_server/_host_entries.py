"""What the host server's bookkeeping is made of: a connection (:class:`Client`), one of its
requests (:class:`Entry`), a reply to send (:data:`Delivery`), the grace period after a
restart (:class:`Recovery`), and an entry as the journal has it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._core._scheduler import Demand
from .._host._procs import ProcessId
from .._printable import printable
from .._wire._protocol import ErrorCode, ProtocolError, ServerMessage
from ._journal import JournalEntry

__all__ = ["ID_BLOCK", "Client", "Delivery", "Entry", "Recovery"]


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


def _pairs(held: tuple[tuple[int, int], ...] | None, most: int = 8) -> str:
    """``held`` for an error message (at most ``most`` pairs: a reply has a size limit)."""
    if held is None:
        return "nothing (a waiter)"
    shown = ", ".join(f"[{gpu}, {units}]" for gpu, units in held[:most])
    return f"[{shown}{', ...' if len(held) > most else ''}]"


def _bad(message: str, req: int) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_REQUEST, message, req)
