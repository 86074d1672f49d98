"""What the watcher reads of a process: its parent, group, session and owner, from /proc.

The reader is :mod:`hwpool._host._procs`'s (one reader of /proc for the watcher, the server
and the job table); this module names it for the watcher. :class:`ProcReader` is the
interface, so that tests can feed their own table.
"""

from __future__ import annotations

from .._host._procs import ProcFS, ProcReader, ProcStat

__all__ = ["ProcFS", "ProcReader", "ProcStat"]
