"""What /proc says of a process: its place in the process tree, its owner, its start time.

``/proc/PID/stat`` gives the state, parent pid, process group and session (fields 3 to 6,
after the command name in parentheses, which may itself hold spaces and parentheses: the
fields are read after its *last* closing parenthesis) and the start time (field 22, clock
ticks after boot). ``/proc/PID/status`` gives the real uid. A process that is gone (or
unreadable) reads as None: whoever asks then knows less, and never fails.

A pid alone names a process only while it lives: once it ends, the kernel may give the same
pid to any later process, another user's included. :class:`ProcessId` is what names one
process for good: its pid, its start time and its uid, read together; a process *is* the one
recorded only while all three still match (:func:`is_process`). The job table, the server's
record of each client and the watcher all use it (one reader of /proc for all of them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "ProcFS",
    "ProcReader",
    "ProcStat",
    "ProcessId",
    "identify",
    "is_process",
    "process_start",
]

_READ_BYTES = 8192  # /proc/PID/stat is under 1 KiB, /proc/PID/status about 1.5 KiB
_ENDED = ("Z", "X")  # a zombie (ended, not reaped yet) or a dead process


@dataclass(frozen=True)
class ProcStat:
    """A process's place in the process tree: its pid, parent pid, group id and session id."""

    pid: int
    ppid: int
    pgid: int
    sid: int


@dataclass(frozen=True)
class ProcessId:
    """One process, for good: ``pid`` with its ``start`` time (clock ticks after boot) and
    its real ``uid``. Another process that gets the pid later differs in its start time."""

    pid: int
    start: int
    uid: int


class ProcReader(Protocol):
    """Reads processes; None for one that is gone or unreadable."""

    def stat(self, pid: int) -> ProcStat | None:
        """``pid``'s parent, group and session."""
        ...

    def uid(self, pid: int) -> int | None:
        """``pid``'s real uid."""
        ...


class ProcFS:
    """A :class:`ProcReader` over a procfs mounted at ``root`` (``/proc``), which also reads
    start times and lists a process group's members."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root

    def stat(self, pid: int) -> ProcStat | None:
        """Parse ``/proc/PID/stat``; None if it is gone or not as expected."""
        fields = self._fields(pid)
        try:
            return ProcStat(pid, int(fields[1]), int(fields[2]), int(fields[3]))
        except (IndexError, ValueError):
            return None

    def uid(self, pid: int) -> int | None:
        """The real uid on the ``Uid:`` line of ``/proc/PID/status``; None if gone."""
        for line in (self._read(pid, "status") or "").splitlines():
            name, _, values = line.partition(":")
            real = values.split()[:1]
            if name == "Uid":
                return int(real[0]) if real and real[0].isascii() and real[0].isdigit() else None
        return None

    def start(self, pid: int) -> int | None:
        """``pid``'s start time (clock ticks after boot); None if it is gone or has ended (a
        zombie: it holds nothing any more, and its pid is about to be free)."""
        fields = self._fields(pid)
        if len(fields) < 20 or fields[0] in _ENDED or not fields[19].isdigit():
            return None
        return int(fields[19])

    def pids(self) -> list[int]:
        """Every pid in this procfs now (empty if it cannot be listed)."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return [int(name) for name in names if name.isdigit()]

    def members(self, pgid: int) -> list[int]:
        """The live (not ended) processes of process group ``pgid`` now."""
        found = []
        for pid in self.pids():
            fields = self._fields(pid)
            if len(fields) > 2 and fields[0] not in _ENDED and fields[2] == str(pgid):
                found.append(pid)
        return found

    def _fields(self, pid: int) -> list[str]:
        """The fields of ``/proc/PID/stat`` after the command name (state first); [] if gone."""
        text = self._read(pid, "stat")
        return text.rpartition(")")[2].split() if text else []

    def _read(self, pid: int, name: str) -> str | None:
        """The file's text (one raw read: a procfs file this size comes whole, and a raw
        read costs half what a text-mode open does, which matters at 100 processes a poll)."""
        try:
            fd = os.open(f"{self.root}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.read(fd, _READ_BYTES).decode("utf-8", "replace")
        except OSError:
            return None
        finally:
            os.close(fd)


_PROC = ProcFS()


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot), or None when no such
    process lives (or a zombie: it has ended) or ``/proc`` is not there."""
    return _PROC.start(pid)


def identify(pid: int, procs: ProcFS = _PROC) -> ProcessId | None:
    """Process ``pid`` as it is now (pid, start time, uid); None if it is gone, has ended or
    cannot be read (no ``/proc``: nothing can be proven)."""
    if pid <= 0:
        return None
    start, uid = procs.start(pid), procs.uid(pid)
    if start is None or uid is None or procs.start(pid) != start:  # not reused in between
        return None
    return ProcessId(pid, start, uid)


def is_process(ident: ProcessId, procs: ProcFS = _PROC) -> bool:
    """Whether ``ident``'s process still lives: the same pid, start time and uid."""
    return identify(ident.pid, procs) == ident
