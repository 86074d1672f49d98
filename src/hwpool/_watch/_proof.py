"""Which processes of a lease hwpool may signal: those proven to be its job's, or none.

The rule (docs/security.md, "What hwpool signals, and when a GPU is free"): hwpool signals
only processes it has proven belong to the lease. A lease's *holder* is the process that
connected, as the server recorded it when it accepted the connection: the ``SO_PEERCRED``
pid with its start time and uid (:class:`~hwpool._host._procs.ProcessId`). ``hwpool run``
and a job's launcher start their job as a child that leads a process group of its own (the
*job group*). A GPU process's job group may be signalled when, read now:

- the holder is still that process (the same pid, start time and uid): a pid that the kernel
  gave to another process after the holder ended proves nothing;
- the GPU process descends (by the parent chain) from a child of the holder, and that child
  leads its process group: the group the holder made for its job;
- every live process of that group has the holder's uid.

Anything else is not proven, and :func:`job_group` says why instead: a holder that uses the
GPU itself (a plain ``GPUPool`` client, not a job: it has no job group, and its own group or
session may hold anything, a root shell's included), a group another user's process is in,
a holder that has ended. The group's members are named by :class:`ProcessId`, so that each
is signalled only while it is still that process (:func:`~hwpool._host._signal.signal_process`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._host._procs import ProcessId, ProcFS, identify, is_process

__all__ = ["JobGroup", "has_job", "job_group"]

_MAX_DEPTH = 512  # a parent chain longer than this is not followed further


@dataclass(frozen=True)
class JobGroup:
    """A lease's job group, proven: ``pgid`` (led by a child of the holder) and its live
    ``members`` when it was read."""

    pgid: int
    members: tuple[ProcessId, ...]


def job_group(holder: ProcessId | None, pid: int, procs: ProcFS) -> JobGroup | str:
    """The job group of GPU process ``pid`` of the lease held by ``holder``, proven (see the
    module docstring); else why it is not proven, in words for the log."""
    if holder is None:
        return "its holder's start time could not be read when it connected"
    if not is_process(holder, procs):
        return f"its holder pid {holder.pid} has ended (the pid may name another process now)"
    if pid == holder.pid:
        return (
            f"its holder pid {pid} uses the GPU itself: a client that is not a job, with no "
            "process group of a job of its own"
        )
    job = _child_of(holder.pid, pid, procs)
    if job is None:
        return f"GPU process {pid} does not descend from its holder pid {holder.pid}"
    stat = procs.stat(job)
    if stat is None or stat.pgid != job:
        return f"its job pid {job} does not lead a process group of its own"
    members = [m for m in map(lambda p: identify(p, procs), procs.members(job)) if m]
    others = sorted({m.uid for m in members if m.uid != holder.uid})
    if others:
        return f"its job's process group {job} holds processes of other users (uid {others})"
    return JobGroup(job, tuple(members))


def has_job(holder: ProcessId | None, procs: ProcFS) -> bool:
    """Whether ``holder`` is still that process and a child of it still leads a process
    group of its own with the holder's uid: its job has not ended yet."""
    if holder is None or not is_process(holder, procs):
        return False
    for pid in procs.pids():
        stat = procs.stat(pid)
        if stat is not None and stat.ppid == holder.pid and stat.pgid == pid:
            child = identify(pid, procs)
            if child is not None and child.uid == holder.uid:
                return True
    return False


def _child_of(holder: int, pid: int, procs: ProcFS) -> int | None:
    """The child of ``holder`` that ``pid`` is or descends from; None if it descends from
    none (or the chain cannot be read)."""
    for _ in range(_MAX_DEPTH):
        stat = procs.stat(pid)
        if stat is None or stat.ppid <= 1:
            return None
        if stat.ppid == holder:
            return pid
        pid = stat.ppid
    return None
