"""The restart journal: the leases and the queue a server held, beside its socket.

A server killed with SIGKILL and started again reads it to know which leases and waiters to
expect back from their clients. It is written ahead: the server appends the changes of one
turn of its event loop (one ``os.write`` of whole lines) before it sends that turn's replies,
so no client ever holds a grant the journal does not name. Neither ``fsync`` nor
``O_SYNC`` is used: the journal only has to survive the server process (a written page is
in the kernel's cache the moment ``write`` returns), not the machine; after a reboot no
client is left to reclaim anything.

The file (``<socket>.journal``) is a log of JSON lines: a header, then records, each one
whole line::

    {"format": "hwpool-journal", "version": 2, "server_pid": 4242}
    {"op": "ids", "limit": 2049}                       ids below this may have been shown
    {"op": "counters", "granted": 7, "released": 5, "cancelled": 0, "timed_out": 1}
    {"op": "queued", "id": 9, "uid": ..., "held": null, ...}      a waiter (or its update)
    {"op": "granted", "id": 9, "uid": ..., "held": [[0, 500]], ...}     a lease (or update)
    {"op": "granted", ..., "limit_end": 81234.5}   a lease with a time limit, which ends then
    {"op": "granted", ..., "start": 81200.5}   when it was granted (the same clock)
    {"op": "released", "id": 9}   /   {"op": "withdrawn", "id": 10}         gone

Loading replays it. A last line without its newline is what a crash in the middle of an
append leaves: it is ignored, which is safe because the replies of that turn were never
sent. Anything else that is not a valid record is a :class:`JournalError`. When the log has
grown to ``COMPACT_RATIO`` times the live state (plus ``COMPACT_SLACK`` lines), a thread
writes a snapshot of the live state to ``<journal>.tmp``; the event loop then appends the
records written meanwhile and renames it over the journal. The cost of a change is one line,
whatever the size of the queue.

The id limit is also kept in a small file of its own, ``<socket>.ids`` (one decimal number,
replaced by a rename, written before any id of a new block is shown): a journal that is
deleted, emptied or corrupted does not make the next server hand out ids again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .._check import check_int, check_real
from .._wire._bounds import MAX_ID
from .._wire._safety import create_side_file, open_side_file

__all__ = [
    "Counters",
    "Journal",
    "JournalEntry",
    "JournalError",
    "JournalFile",
    "ids_path",
    "journal_path",
    "load",
    "load_ids",
]

FORMAT = "hwpool-journal"
VERSION = 2  # version 1 (one JSON object, rewritten whole) is still read, for upgrades
COMPACT_RATIO = 4
COMPACT_SLACK = 1024


class JournalError(ValueError):
    """A journal file that cannot be read or does not hold a valid journal."""


class Counters(NamedTuple):
    """The server's counters, kept across restarts (what ``hwpool status`` shows)."""

    granted: int = 0
    released: int = 0
    cancelled: int = 0
    timed_out: int = 0


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A lease (``held``: its ``(gpu, units)``) or a waiter (``held is None``) of ``pid``.

    ``token`` names the client (one pool of one process) that made it, as that client said in
    its hello; "" where none was said. A reclaim is matched on it, not on the pid alone.
    ``limit_end``: for a lease with a time limit, when it ends, in ``time.monotonic()``
    seconds (CLOCK_MONOTONIC on Linux: one clock for every process of one boot, which is as
    long as a journal matters); None for none (and in journals written before it existed).
    ``start``: for a lease, when it was granted, on the same clock, so that a restarted
    server counts its owner's fair-share usage from then (neither from its own start nor
    from the clock's origin); None where unknown (a waiter, or a journal written before it
    existed).
    """

    id: int
    uid: int
    pid: int
    count: int
    units: int
    held: tuple[tuple[int, int], ...] | None = None
    token: str = ""
    limit_end: float | None = None
    start: float | None = None


@dataclass(frozen=True, slots=True)
class Journal:
    """Ids below ``id_limit`` may be in use; ``entries``: leases by id, then the queue."""

    id_limit: int
    entries: tuple[JournalEntry, ...] = ()
    counters: Counters = Counters()  # noqa: RUF009 (an immutable tuple)


def journal_path(socket_path: Path) -> Path:
    """Where the server of ``socket_path`` keeps its journal: ``<socket>.journal``."""
    return socket_path.with_name(socket_path.name + ".journal")


def ids_path(socket_path: Path) -> Path:
    """Where the server of ``socket_path`` keeps its id limit: ``<socket>.ids``."""
    return socket_path.with_name(socket_path.name + ".ids")


# ----------------------------------------------------------------- encoding
def _line(record: Mapping[str, object]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def _entry_line(entry: JournalEntry) -> str:
    """One entry's record (formatted directly: every field but the token is an int)."""
    if entry.held is None:
        op, held = "queued", "null"
    else:
        op, held = "granted", "[" + ",".join(f"[{g},{u}]" for g, u in entry.held) + "]"
    end = "" if entry.limit_end is None else f',"limit_end":{entry.limit_end!r}'
    if entry.start is not None:
        end += f',"start":{entry.start!r}'
    return (
        f'{{"op":"{op}","id":{entry.id},"uid":{entry.uid},"pid":{entry.pid},'
        f'"count":{entry.count},"units":{entry.units},"held":{held},'
        f'"token":{_quoted(entry.token)}{end}}}\n'
    )


@functools.lru_cache(maxsize=1024)
def _quoted(token: str) -> str:
    """``token`` as a JSON string, made once per token (a client's, on each of its records)."""
    return json.dumps(token)


def _gone_line(entry: JournalEntry) -> str:
    op = "withdrawn" if entry.held is None else "released"
    return f'{{"op":"{op}","id":{entry.id}}}\n'


def _ids_line(limit: int) -> str:
    return f'{{"op":"ids","limit":{limit}}}\n'


def _counters_line(counters: Counters) -> str:
    """The counters' record (formatted directly, as ``_line`` would: one is written every
    turn of the loop that changes anything, and ``json.dumps`` was most of a turn's cost)."""
    granted, released, cancelled, timed_out = counters
    return (
        f'{{"op":"counters","granted":{granted},"released":{released},'
        f'"cancelled":{cancelled},"timed_out":{timed_out}}}\n'
    )


def _snapshot_lines(server_pid: int, journal: Journal) -> list[str]:
    header = _line({"format": FORMAT, "version": VERSION, "server_pid": server_pid})
    return [
        header, _ids_line(journal.id_limit), _counters_line(journal.counters),
        *(_entry_line(e) for e in journal.entries),
    ]  # fmt: skip


# ----------------------------------------------------------------- side files
def _read(path: Path) -> bytes | None:
    """The bytes of ``path``, or None if there is none. It must be a regular file of this
    server's uid that no one else may write (never a symlink or a FIFO: see _wire._safety);
    otherwise UnsafePathError, an OSError."""
    try:
        fd = open_side_file(path, os.O_RDONLY, what="journal file")
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as file:
        return file.read()


def _create(path: Path) -> int:
    """A new, empty file at ``path`` for appending (what had that name is removed first;
    O_EXCL and O_NOFOLLOW: a symlink or file planted in between is never followed)."""
    return create_side_file(path, os.O_WRONLY | os.O_APPEND, what="journal file")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _replace(path: Path, data: bytes) -> int:
    """Write ``data`` to ``<path>.tmp`` and rename it to ``path``; the open descriptor
    (positioned at the end, for appends). Readers see the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = _create(tmp)
    try:
        _write_all(fd, data)
        os.replace(tmp, path)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


def save_ids(path: Path, limit: int) -> None:
    """Record that ids below ``limit`` may have been shown (atomically, by a rename)."""
    os.close(_replace(path, f"{limit}\n".encode()))


def load_ids(path: Path) -> int | None:
    """The id limit kept at ``path``, or None if there is none; JournalError if corrupt."""
    try:
        data = _read(path)
    except OSError as exc:
        raise JournalError(
            f"cannot read the id file {str(path)!r}: {exc.strerror or exc}"
        ) from None
    if data is None:
        return None
    try:
        return check_int("id limit", int(data.decode("ascii")), minimum=1, maximum=MAX_ID)
    except (UnicodeDecodeError, ValueError) as exc:
        raise JournalError(f"the id file {str(path)!r} is not valid: {exc}") from None


# ----------------------------------------------------------------- loading
def load(path: Path) -> Journal | None:
    """The journal at ``path``, or None if there is none; JournalError if it is corrupt.

    A last line cut short (a crash in the middle of an append) is ignored.
    """
    try:
        data = _read(path)
    except OSError as exc:
        raise JournalError(
            f"cannot read the journal {str(path)!r}: {exc.strerror or exc}"
        ) from None
    if data is None:
        return None
    try:
        if b"\n" not in data:  # version 1: one JSON object, no newline
            return _parse_v1(json.loads(data))
        lines = data.split(b"\n")[:-1]  # what follows the last newline was cut short
        return _replay(lines)
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(f"the journal {str(path)!r} is not valid: {exc}") from None


def _replay(lines: list[bytes]) -> Journal:
    header = json.loads(lines[0])
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError("not an hwpool journal")
    if header.get("version") != VERSION:
        raise ValueError(f"journal version {header.get('version')!r}, expected {VERSION}")
    live: dict[int, JournalEntry] = {}
    limit, counters = 1, Counters()
    for number, line in enumerate(lines[1:], 2):
        try:
            limit, counters = _apply(json.loads(line), live, limit, counters)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return _checked(limit, live.values(), counters)


def _apply(
    record: object, live: dict[int, JournalEntry], limit: int, counters: Counters
) -> tuple[int, Counters]:
    """Apply one record to ``live``; the id limit and counters after it."""
    if not isinstance(record, dict):
        raise TypeError(f"a record must be an object, got {record!r}")
    op = record.get("op")
    if op in ("queued", "granted"):
        entry = _parse_entry(record)
        if (entry.held is None) != (op == "queued"):
            raise ValueError(f"a {op!r} record with held {record['held']!r}")
        live[entry.id] = entry
    elif op in ("released", "withdrawn"):
        live.pop(check_int("id", record["id"], minimum=1), None)
    elif op == "ids":
        limit = max(limit, check_int("limit", record["limit"], minimum=1, maximum=MAX_ID))
    elif op == "counters":
        counters = Counters(*(check_int(k, record[k], minimum=0) for k in Counters._fields))
    else:
        raise ValueError(f"unknown record {op!r}")
    return limit, counters


def _ordered(limit: int, entries: Iterable[JournalEntry], counters: Counters) -> Journal:
    """The journal of these parts: leases by id, then waiters by id."""
    return Journal(limit, tuple(sorted(entries, key=lambda e: (e.held is None, e.id))), counters)


def _checked(limit: int, entries: Iterable[JournalEntry], counters: Counters) -> Journal:
    """:func:`_ordered`, with every id checked to be below the id limit."""
    journal = _ordered(limit, entries, counters)
    for entry in journal.entries:
        if entry.id >= limit:
            raise ValueError(f"entry id {entry.id} is not below the id limit {limit}")
    return journal


def _parse_v1(raw: object) -> Journal:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError("not an hwpool journal")
    if raw.get("version") != 1:
        raise ValueError(f"journal version {raw.get('version')!r}, expected 1 or {VERSION}")
    entries = raw["entries"]
    if not isinstance(entries, list):
        raise TypeError("entries must be a list")
    limit = check_int("id_limit", raw["id_limit"], minimum=1, maximum=MAX_ID)
    return _checked(limit, [_parse_entry(e) for e in entries], Counters())


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
        check_int("id", raw["id"], minimum=1, maximum=MAX_ID),
        check_int("uid", raw["uid"], minimum=0),
        check_int("pid", raw["pid"], minimum=1),
        check_int("count", raw["count"], minimum=1),
        check_int("units", raw["units"], minimum=1),
        pairs,
        _parse_token(raw.get("token", "")),
        _parse_time("limit_end", raw.get("limit_end")),
        _parse_time("start", raw.get("start")),
    )


def _parse_time(name: str, raw: object) -> float | None:
    """A lease's ``limit_end`` (monotonic seconds) or ``start`` (wall-clock seconds): a
    finite number, or None."""
    if raw is None:
        return None
    number = check_real(name, raw)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {raw!r}")
    return number


def _parse_token(raw: object) -> str:
    if not isinstance(raw, str) or len(raw) > 64 or not raw.isprintable():
        raise TypeError(f"token must be a printable string of at most 64 characters, got {raw!r}")
    return raw


# ----------------------------------------------------------------- writing
Changes = Mapping[int, JournalEntry | None]
"""What changed, by id: the entry as it is now, or None where it is gone."""


class _Compaction:
    """A snapshot being written by a thread, and the lines appended to the journal meanwhile."""

    def __init__(
        self, path: Path, server_pid: int, parts: tuple[int, list[JournalEntry], Counters]
    ) -> None:
        self.lines = len(parts[1]) + 3
        self.tail: list[bytes] = []
        self.fd: int | None = None
        self.error: OSError | None = None
        self.path = path.with_name(path.name + ".tmp")
        self.thread = threading.Thread(
            target=self._write, args=(server_pid, parts), name="hwpool-compact", daemon=True
        )
        self.thread.start()

    def _write(self, server_pid: int, parts: tuple[int, list[JournalEntry], Counters]) -> None:
        """The thread: sort, encode and write the snapshot (nothing of it on the event loop)."""
        try:
            data = "".join(_snapshot_lines(server_pid, _ordered(*parts))).encode()
            self.fd = _create(self.path)
            _write_all(self.fd, data)
        except OSError as exc:
            self.error = exc


class JournalFile:
    """The journal on disk, written by the event loop's thread only (compacted by another).

    It mirrors what is on disk (``live``, ``id_limit``, ``counters``): :meth:`write` appends
    what differs and returns once it is written; if it raises OSError, nothing of it counts
    as written (a partial append is cut off again), and the caller offers it again later.
    The first :meth:`write` replaces the file with a snapshot of ``journal``. ``log`` says
    what goes wrong off the caller's path (a compaction that failed).
    """

    def __init__(
        self, path: Path, ids: Path, server_pid: int, journal: Journal, *,
        ids_on_disk: int = 0, log: Callable[[str], None] = lambda line: None,
    ) -> None:  # fmt: skip
        self.path, self.ids, self.server_pid, self.log = path, ids, server_pid, log
        self.live = {e.id: e for e in journal.entries}
        self.id_limit, self.counters = journal.id_limit, journal.counters
        self.ids_on_disk = ids_on_disk
        self.lines = 0  # lines in the file: its header and records
        self.size = 0
        self.fd: int | None = None  # None: the next write starts a new file
        self.compaction: _Compaction | None = None
        self.retry_at = 0  # after a failed compaction, the next waits for this many lines

    def journal(self) -> Journal:
        """What the file holds (as :func:`load` would read it)."""
        return _ordered(self.id_limit, self.live.values(), self.counters)

    def write(self, id_limit: int, changes: Changes, counters: Counters) -> None:
        """Make ``changes``, the id limit and the counters durable; OSError if they are not."""
        self._finish_compaction()
        if self.fd is None:
            self._start_file()
        if max(id_limit, self.id_limit) > self.ids_on_disk:
            save_ids(self.ids, max(id_limit, self.id_limit))
            self.ids_on_disk = max(id_limit, self.id_limit)
        lines = [_ids_line(id_limit)] if id_limit > self.id_limit else []
        for ident, entry in changes.items():
            if entry is not None:
                lines.append(_entry_line(entry))
            elif ident in self.live:
                lines.append(_gone_line(self.live[ident]))
        if counters != self.counters:
            lines.append(_counters_line(counters))
        if lines:
            self._append("".join(lines).encode(), len(lines))
        self._mirror(id_limit, changes, counters)
        self._compact_if_due()

    def _mirror(self, id_limit: int, changes: Changes, counters: Counters) -> None:
        self.id_limit, self.counters = max(id_limit, self.id_limit), counters
        for ident, entry in changes.items():
            if entry is None:
                self.live.pop(ident, None)
            else:
                self.live[ident] = entry

    def _append(self, data: bytes, lines: int) -> None:
        assert self.fd is not None
        try:
            _write_all(self.fd, data)
        except OSError:
            try:
                os.ftruncate(self.fd, self.size)  # a partial line must not stay in the middle
            except OSError:
                self._drop_file()  # the next write starts a new file: nothing follows the cut
            raise
        self.size += len(data)
        self.lines += lines
        if self.compaction is not None:
            self.compaction.tail.append(data)

    def _start_file(self) -> None:
        """Replace the journal with a snapshot of what this mirror holds (synchronously)."""
        lines = _snapshot_lines(self.server_pid, self.journal())
        data = "".join(lines).encode()
        self.fd = _replace(self.path, data)
        self.size, self.lines = len(data), len(lines)

    def _drop_file(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # ----------------------------------------------------------------- compaction
    def _compact_if_due(self) -> None:
        """Past ``COMPACT_RATIO`` times the live state, start a snapshot on a thread (what the
        event loop does here is one copy of the list of live entries)."""
        if self.compaction is None and self.fd is not None:
            due = max(self.retry_at, COMPACT_RATIO * len(self.live) + COMPACT_SLACK)
            if self.lines > due:
                parts = (self.id_limit, list(self.live.values()), self.counters)
                self.compaction = _Compaction(self.path, self.server_pid, parts)

    def _finish_compaction(self, wait: bool = False) -> None:
        """Swap in a snapshot the thread has written (with what was appended since)."""
        job = self.compaction
        if job is None or (job.thread.is_alive() and not wait):
            return
        job.thread.join()
        self.compaction = None
        try:
            if job.error is not None or job.fd is None:
                raise job.error or OSError("no snapshot")
            _write_all(job.fd, b"".join(job.tail))
            os.replace(job.path, self.path)
        except OSError as exc:
            if job.fd is not None:
                os.close(job.fd)
            with contextlib.suppress(OSError):
                os.unlink(job.path)
            self.log(f"cannot compact the journal {str(self.path)!r}: {exc.strerror or exc}")
            self.retry_at = self.lines + len(self.live) + COMPACT_SLACK  # try again later
            return
        self._drop_file()
        self.fd = job.fd
        self.size = os.fstat(job.fd).st_size
        self.lines = job.lines + sum(part.count(b"\n") for part in job.tail)

    def close(self) -> None:
        """Finish a compaction under way, then close the file."""
        self._finish_compaction(wait=True)
        self._drop_file()
