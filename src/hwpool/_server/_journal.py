"""The restart journal: the leases and the queue a server held, beside its socket.

The server rewrites it (a temporary file, then an atomic rename), from a thread of its own,
shortly after each change and at exit, so that a server killed with SIGKILL and started
again knows which leases and waiters to expect back from their clients and in which order.
It is not fsync'ed: it only has to survive the server process, not the machine (after a
reboot no client is left to reclaim).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._check import check_int

__all__ = [
    "Journal",
    "JournalEntry",
    "JournalError",
    "JournalWriter",
    "journal_path",
    "load",
    "save",
]

FORMAT = "hwpool-journal"
VERSION = 1


class JournalError(ValueError):
    """A journal file that cannot be read or does not hold a valid journal."""


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A lease (``held``: its ``(gpu, units)``) or a waiter (``held is None``) of ``pid``.

    ``token`` names the client (one pool of one process) that made it, as that client said in
    its hello; "" where none was said. A reclaim is matched on it, not on the pid alone.
    """

    id: int
    uid: int
    pid: int
    count: int
    units: int
    held: tuple[tuple[int, int], ...] | None = None
    token: str = ""


@dataclass(frozen=True, slots=True)
class Journal:
    """Ids below ``id_limit`` may be in use; ``entries``: leases by id, then the queue in order."""

    id_limit: int
    entries: tuple[JournalEntry, ...] = ()


def journal_path(socket_path: Path) -> Path:
    """Where the server of ``socket_path`` keeps its journal: ``<socket>.journal``."""
    return socket_path.with_name(socket_path.name + ".journal")


def save(path: Path, journal: Journal, *, server_pid: int) -> None:
    """Replace the journal at ``path`` atomically (readers see the old or the new one)."""
    data = {
        "format": FORMAT,
        "version": VERSION,
        "server_pid": server_pid,
        "id_limit": journal.id_limit,
        "entries": [_entry_json(e) for e in journal.entries],
    }
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, separators=(",", ":"))
    os.replace(tmp, path)


def _entry_json(entry: JournalEntry) -> dict[str, object]:
    held = None if entry.held is None else [list(p) for p in entry.held]
    return {
        "id": entry.id, "uid": entry.uid, "pid": entry.pid, "count": entry.count,
        "units": entry.units, "held": held, "token": entry.token,
    }  # fmt: skip


def load(path: Path) -> Journal | None:
    """The journal at ``path``, or None if there is none; JournalError if it is corrupt."""
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JournalError(f"cannot read the journal {str(path)!r}: {exc}") from None
    try:
        return _parse(raw)
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(f"the journal {str(path)!r} is not valid: {exc}") from None


def _parse(raw: object) -> Journal:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError("not an hwpool journal")
    if raw.get("version") != VERSION:
        raise ValueError(f"journal version {raw.get('version')!r}, expected {VERSION}")
    entries = raw["entries"]
    if not isinstance(entries, list):
        raise TypeError("entries must be a list")
    return Journal(
        check_int("id_limit", raw["id_limit"], minimum=1),
        tuple(_parse_entry(e) for e in entries),
    )


def _parse_entry(raw: object) -> JournalEntry:
    if not isinstance(raw, dict):
        raise TypeError(f"an entry must be an object, got {raw!r}")
    held = raw["held"]
    pairs = None
    if held is not None:
        if not isinstance(held, list) or not held:
            raise TypeError(f"held must be a non-empty list, got {held!r}")
        if not all(isinstance(p, list) and len(p) == 2 for p in held):
            raise TypeError(f"held must list [gpu, units] pairs, got {held!r}")
        pairs = tuple(
            (check_int("gpu", p[0], minimum=0), check_int("units", p[1], minimum=1)) for p in held
        )
    return JournalEntry(
        check_int("id", raw["id"], minimum=1),
        check_int("uid", raw["uid"], minimum=0),
        check_int("pid", raw["pid"], minimum=1),
        check_int("count", raw["count"], minimum=1),
        check_int("units", raw["units"], minimum=1),
        pairs,
        _parse_token(raw.get("token", "")),
    )


def _parse_token(raw: object) -> str:
    if not isinstance(raw, str) or len(raw) > 64 or not raw.isprintable():
        raise TypeError(f"token must be a printable string of at most 64 characters, got {raw!r}")
    return raw


class JournalWriter:
    """Writes journals on its own thread, newest first, so the event loop never waits for disk.

    ``submit`` hands over the journal of state version ``version`` (versions only grow); the
    thread writes the newest one it was given, one write at a time, so an older journal can
    never replace a newer one. ``wait`` blocks until ``version`` (or a later one) is written.
    """

    def __init__(self, path: Path, server_pid: int, on_error: Callable[[str], None]) -> None:
        self.path = path
        self.server_pid = server_pid
        self.on_error = on_error
        self.submitted = -1
        self.written = -1
        self._next: tuple[int, Journal] | None = None
        self._stopping = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hwpool-journal", daemon=True)
        self._thread.start()

    def submit(self, version: int, journal: Journal) -> None:
        with self._changed:
            self.submitted = version
            self._next = (version, journal)
            self._changed.notify_all()

    def wait(self, version: int, timeout: float = 10.0) -> bool:
        """Whether ``version`` was written within ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: self.written >= version, timeout)

    def stop(self) -> None:
        """Write what was submitted, then end the thread."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._next is not None or self._stopping)
                if self._next is None:
                    return
                (version, journal), self._next = self._next, None
            try:
                save(self.path, journal, server_pid=self.server_pid)
            except OSError as exc:
                self.on_error(f"cannot write the journal {str(self.path)!r}: {exc.strerror}")
            with self._changed:
                self.written = version
                self._changed.notify_all()
