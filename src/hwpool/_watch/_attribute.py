"""Which lease each GPU process belongs to, that it is outside the queue, or that it is unknown.

A lease is described by what the server knows of its holder (:class:`LeaseProcs`): pids its
client reported (the client itself, the job ``hwpool run`` started), and the process group
or session the job was started in, where it was given one of its own. A process belongs to a
lease when it, or its nearest ancestor that matches any lease, has one of the lease's pids,
its process group or its session: a job's children and grandchildren count, even ones that
moved to a group or session of their own, because the parent chain (``/proc/PID/stat``) still
leads to the job. Where several leases match at the nearest level (a client holding two
leases), the one that holds the process's GPU wins, then the lowest lease id.

A process that matches no lease is *outside the queue* only if its pid names a process in
this pid namespace (``/proc/PID`` exists): then it is one, with an owner an admin can see. A
pid that names none is *unknown*: the process ended between the driver's list and the read,
or it is in another pid namespace (the driver reports host pids: NVML and nvidia-smi do not
translate them into a container's namespace), so nothing is known of it but its memory; it is
neither a lease's nor outside the queue, and is never signalled.

A lease whose pids, group and session are numbered in another pid namespace (``pidns``: a
container's, seen from the host) matches a process by its ids in that namespace: the last
entries of ``NSpid:``, ``NSpgid:`` and ``NSsid:`` of a process whose own namespace is that one.

Only pass a ``pgid`` or ``sid`` that the job has to itself: a login shell's session holds
unrelated processes too. Pure apart from the injected :class:`~._procfs.ProcReader` and the
uid-to-name lookup; each call walks each ancestor once (shared ancestors are remembered).
"""

from __future__ import annotations

import functools
import pwd
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ._procfs import ProcReader
from ._sample import GPUProcess, Sample

__all__ = [
    "Attributed",
    "LeaseProcs",
    "attribute",
    "lease_use_mib",
    "outside_mib",
    "user_name",
]

_MAX_DEPTH = 512  # a parent chain longer than this is not followed further


@dataclass(frozen=True)
class LeaseProcs:
    """What identifies a lease's processes: ``pids`` reported by its client, and the process
    group (``pgid``) and session (``sid``) of its job where it has its own; ``gpus``: the
    UUIDs of the devices it holds; ``pidns``: the pid namespace these ids are numbered in
    (its inode, see :func:`~hwpool._host._procs.pid_namespace`), None for the watcher's own."""

    lease: int
    gpus: frozenset[str] = field(default_factory=frozenset)
    pids: frozenset[int] = field(default_factory=frozenset)
    pgid: int | None = None
    sid: int | None = None
    pidns: int | None = None


@dataclass(frozen=True)
class Attributed:
    """A GPU process and whom it belongs to: ``lease`` (None: none), and its owner's uid
    and user name (None and "" when the process could not be read). ``unknown``: it matched
    no lease and its pid names no process in this pid namespace (ended, or in another one):
    not outside the queue either."""

    process: GPUProcess
    lease: int | None
    uid: int | None
    user: str
    unknown: bool = False

    @property
    def outside(self) -> bool:
        """Whether it is outside the queue: a process here that matches no lease."""
        return self.lease is None and not self.unknown


@functools.lru_cache(maxsize=1024)
def user_name(uid: int) -> str:
    """The user name of ``uid`` ("uid N" if it has none), remembered per process."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def attribute(
    processes: Iterable[GPUProcess],
    leases: Sequence[LeaseProcs],
    procs: ProcReader,
    name_of: Callable[[int], str] = user_name,
) -> list[Attributed]:
    """Each of ``processes`` with its lease (None: outside the queue, or unknown) and its
    owner."""
    index = _Index(leases)
    matched: dict[int, tuple[LeaseProcs, ...]] = {}
    found = []
    for process in processes:
        lease = _choose(_matches(process.pid, index, procs, matched), process.gpu)
        uid = procs.uid(process.pid)
        unknown = lease is None and procs.stat(process.pid) is None
        user = "" if uid is None else name_of(uid)
        found.append(Attributed(process, lease, uid, user, unknown))
    return found


class _Index:
    """The leases by pid, by process group and by session."""

    def __init__(self, leases: Sequence[LeaseProcs]) -> None:
        # Keyed by (pid namespace, id): None is the watcher's own namespace.
        self.by_pid: dict[tuple[int | None, int], list[LeaseProcs]] = {}
        self.by_pgid: dict[tuple[int | None, int], list[LeaseProcs]] = {}
        self.by_sid: dict[tuple[int | None, int], list[LeaseProcs]] = {}
        for lease in leases:
            ns = lease.pidns
            for pid in lease.pids:
                self.by_pid.setdefault((ns, pid), []).append(lease)
            if lease.pgid is not None:
                self.by_pgid.setdefault((ns, lease.pgid), []).append(lease)
            if lease.sid is not None:
                self.by_sid.setdefault((ns, lease.sid), []).append(lease)
        self.namespaces = {lease.pidns for lease in leases} - {None}

    def direct(
        self, pid: int, pgid: int | None, sid: int | None, ns: int | None = None
    ) -> tuple[LeaseProcs, ...]:
        """The leases numbered in namespace ``ns`` that name ``pid``, its group or its
        session."""
        found = self.by_pid.get((ns, pid), [])
        found = found + (self.by_pgid.get((ns, pgid), []) if pgid is not None else [])
        return tuple(found + (self.by_sid.get((ns, sid), []) if sid is not None else []))

    def nested(self, pid: int, procs: ProcReader) -> tuple[LeaseProcs, ...]:
        """The leases numbered in ``pid``'s own pid namespace (another than the watcher's)
        that name it by its ids there."""
        ids = procs.ns_ids(pid) if self.namespaces else None
        if ids is None or ids.ns not in self.namespaces:
            return ()
        return self.direct(ids.pid, ids.pgid or None, ids.sid or None, ids.ns)


def _matches(
    pid: int, index: _Index, procs: ProcReader, matched: dict[int, tuple[LeaseProcs, ...]]
) -> tuple[LeaseProcs, ...]:
    """The leases matching ``pid`` or its nearest matching ancestor; remembered in
    ``matched`` for every process walked, so that siblings share the walk."""
    walked: list[int] = []
    found: tuple[LeaseProcs, ...] = ()
    while pid > 1 and pid not in walked and len(walked) < _MAX_DEPTH:
        if pid in matched:
            found = matched[pid]
            break
        walked.append(pid)
        stat = procs.stat(pid)
        found = index.direct(pid, *((stat.pgid, stat.sid) if stat else (None, None)))
        found = found or (index.nested(pid, procs) if stat else ())
        if found or stat is None:
            break
        pid = stat.ppid
    for walked_pid in walked:
        matched[walked_pid] = found
    return found


def _choose(leases: tuple[LeaseProcs, ...], gpu: str) -> int | None:
    """The lease among ``leases`` that holds ``gpu``, else the lowest id; None if none."""
    if not leases:
        return None
    holding = [lease.lease for lease in leases if gpu in lease.gpus]
    return min(holding or [lease.lease for lease in leases])


def outside_mib(sample: Sample, attributed: Iterable[Attributed]) -> dict[str, int | None]:
    """Per device of ``sample``, the memory (MiB) its processes outside the queue hold: 0 if
    none; None if unknown (its process list unreadable, or such a process's memory unknown).
    An unknown process's memory is not counted: nothing says it is outside the queue."""
    held: dict[str, int | None] = {
        gpu.uuid: None if gpu.processes is None else 0 for gpu in sample.gpus
    }
    for item in attributed:
        if item.outside:
            gpu = item.process.gpu
            held[gpu] = _add(held.get(gpu, 0), item.process.used_mib)
    return held


def lease_use_mib(attributed: Iterable[Attributed]) -> dict[tuple[int, str], int | None]:
    """Per (lease, device UUID) the memory its processes hold there (None: some unknown)."""
    used: dict[tuple[int, str], int | None] = {}
    for item in attributed:
        if item.lease is not None:
            key = (item.lease, item.process.gpu)
            used[key] = _add(used.get(key, 0), item.process.used_mib)
    return used


def _add(total: int | None, mib: int | None) -> int | None:
    return None if total is None or mib is None else total + mib
