"""What the watcher reads of a process: its parent, group, session and owner, from /proc.

The reader is :mod:`hwpool._host._procs`'s (one reader of /proc for the watcher, the server
and the job table); this module names it for the watcher. :class:`ProcReader` is the
interface, so that tests can feed their own table.
"""

from __future__ import annotations

from .._host._procs import INIT_PID_NS, NsIds, ProcFS, ProcReader, ProcStat, pid_namespace

__all__ = ["NsIds", "ProcFS", "ProcReader", "ProcStat", "namespace_note"]


def namespace_note(ns: int | None = None) -> str:
    """What the log should say when this process is not in the host's pid namespace (``ns``,
    default this process's): the driver reports host pids, which name no process here, or by
    chance another one; "" in the host's namespace or where it cannot be read."""
    ns = pid_namespace() if ns is None else ns
    if ns is None or ns == INIT_PID_NS:
        return ""
    return (
        "this server is not in the host's pid namespace (a container's?): NVML and "
        "nvidia-smi report host pids, which name no process here, so GPU processes are "
        "unknown (neither a lease's nor outside the queue), and a host pid that happens to "
        "name a process here is misread; run the server in the host's pid namespace "
        "(docker run --pid=host)"
    )
