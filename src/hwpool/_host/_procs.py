"""What /proc says of a process: its place in the process tree, its owner, its start time.

``/proc/PID/stat`` gives the state, parent pid, process group and session (fields 3 to 6,
after the command name in parentheses, which may itself hold spaces and parentheses: the
fields are read after its *last* closing parenthesis) and the start time (field 22, clock
ticks after boot). ``/proc/PID/status`` gives the real uid, and (Linux 4.1 on) the
``NSpid:``, ``NSpgid:`` and ``NSsid:`` lines: the process's ids in each pid namespace it is
in, from this procfs's namespace (first) to its own (last); ``/proc/PID/ns/pid`` names its
own pid namespace (the inode of that link's target: proc(5), pid_namespaces(7)). A process
that is gone (or unreadable) reads as None: whoever asks then knows less, and never fails.

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
    "INIT_PID_NS",
    "NsIds",
    "ProcFS",
    "ProcReader",
    "ProcStat",
    "ProcessId",
    "identify",
    "is_process",
    "pid_namespace",
    "process_start",
]

_READ_BYTES = 8192  # /proc/PID/stat is under 1 KiB, /proc/PID/status about 1.5 KiB
_ENDED = ("Z", "X")  # a zombie (ended, not reaped yet) or a dead process
INIT_PID_NS = 0xEFFFFFFC
"""The inode of the host's (initial) pid namespace: ``PROC_PID_INIT_INO`` in the kernel's
``include/linux/proc_ns.h``; any other is a container's (or another nested) namespace."""


@dataclass(frozen=True)
class ProcStat:
    """A process's place in the process tree: its pid, parent pid, group id and session id."""

    pid: int
    ppid: int
    pgid: int
    sid: int


@dataclass(frozen=True)
class NsIds:
    """A process as its own pid namespace numbers it: that namespace (``ns``, the inode of
    ``/proc/PID/ns/pid``) and its pid, process group and session there (the last entries of
    ``NSpid:``, ``NSpgid:`` and ``NSsid:``; 0 for a group or session led from outside it)."""

    ns: int
    pid: int
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

    def ns_ids(self, pid: int) -> NsIds | None:
        """``pid`` as its own pid namespace numbers it."""
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

    def ns_ids(self, pid: int) -> NsIds | None:
        """``pid``'s own pid namespace and its pid, group and session there (see
        :class:`NsIds`); None if it is gone, or either file cannot be read (a kernel before
        4.1 writes no ``NSpid:`` line; another user's namespace link needs ptrace access)."""
        last: dict[str, int] = {}
        for line in (self._read(pid, "status") or "").splitlines():
            name, _, values = line.partition(":")
            if name in ("NSpid", "NSpgid", "NSsid") and values.split():
                entry = values.split()[-1]
                if not (entry.isascii() and entry.isdigit()):
                    return None
                last[name] = int(entry)
        ns = pid_namespace(pid, self.root)
        if ns is None or len(last) < 3:
            return None
        return NsIds(ns, last["NSpid"], last["NSpgid"], last["NSsid"])

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


def pid_namespace(pid: int | str = "self", root: str = "/proc") -> int | None:
    """The inode of the pid namespace of process ``pid`` (default: this one), which names
    it; None if it cannot be read. :data:`INIT_PID_NS` is the host's."""
    try:
        return os.stat(f"{root}/{pid}/ns/pid").st_ino
    except OSError:
        return None


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
