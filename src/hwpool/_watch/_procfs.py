"""What the watcher reads of a process: its parent, group, session and owner, from /proc.

``/proc/PID/stat`` gives the parent pid, process group and session (fields 4 to 6, after the
command name in parentheses, which may itself hold spaces and parentheses: the fields are
read after its *last* closing parenthesis). ``/proc/PID/status`` gives the real uid. A
process that is gone (or unreadable) reads as None: the attribution then knows less, and
never fails. :class:`ProcReader` is the interface, so that tests can feed their own table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

__all__ = ["ProcFS", "ProcReader", "ProcStat"]

_READ_BYTES = 8192  # /proc/PID/stat is under 1 KiB, /proc/PID/status about 1.5 KiB


@dataclass(frozen=True)
class ProcStat:
    """A process's place in the process tree: its pid, parent pid, group id and session id."""

    pid: int
    ppid: int
    pgid: int
    sid: int


class ProcReader(Protocol):
    """Reads processes; None for one that is gone or unreadable."""

    def stat(self, pid: int) -> ProcStat | None:
        """``pid``'s parent, group and session."""
        ...

    def uid(self, pid: int) -> int | None:
        """``pid``'s real uid."""
        ...


class ProcFS:
    """A :class:`ProcReader` over a procfs mounted at ``root`` (``/proc``)."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root

    def stat(self, pid: int) -> ProcStat | None:
        """Parse ``/proc/PID/stat``; None if it is gone or not as expected."""
        text = self._read(pid, "stat")
        fields = text.rpartition(")")[2].split() if text else []
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
