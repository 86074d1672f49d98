"""Which lease a GPU process belongs to: /proc as read, and the mapping, with real processes
(a job in its own session, its child in another; a process in a pid namespace of its own)
and with a table of processes."""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from watchprocs import absent_pid, bystander, nested_process, running_job

from hwpool._watch import (
    Attributed,
    GPUProcess,
    GPUReading,
    LeaseProcs,
    NsIds,
    ProcFS,
    ProcStat,
    Sample,
    attribute,
    lease_use_mib,
    outside_mib,
)
from hwpool._watch._procfs import namespace_note

GPU, OTHER = "GPU-aaaa", "GPU-bbbb"


def test_procfs_reads_a_real_process_tree() -> None:
    with running_job() as job:
        procs = ProcFS()
        assert procs.stat(job.pid) == ProcStat(job.pid, os.getpid(), job.pid, job.pid)
        assert procs.stat(job.child) == ProcStat(job.child, job.pid, job.child, job.child)
        assert procs.uid(job.child) == os.getuid()


def test_procfs_reads_a_gone_process_as_none() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert ProcFS().stat(proc.pid) is None and ProcFS().uid(proc.pid) is None


def test_procfs_reads_fields_after_a_command_name_with_parentheses(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (a) b) (c d) S 7 40 30 0 -1 4194560\n")
    (tmp_path / "42" / "status").write_text("Name:\tx\nUid:\t1001\t0\t0\t0\nGid:\t5\n")
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "stat").write_text("43 (short)\n")
    procs = ProcFS(str(tmp_path))
    assert procs.stat(42) == ProcStat(42, 7, 40, 30) and procs.uid(42) == 1001
    assert procs.stat(43) is None and procs.uid(43) is None


def on_gpu(*pids: int, gpu: str = GPU, mib: int | None = 100) -> list[GPUProcess]:
    return [GPUProcess(pid, gpu, mib) for pid in pids]


def test_a_job_and_its_child_in_another_session_belong_to_the_lease_by_session() -> None:
    with running_job() as job, bystander() as outsider:
        lease = LeaseProcs(7, frozenset({GPU}), sid=job.pid)
        found = attribute(on_gpu(job.pid, job.child, outsider), [lease], ProcFS())
    assert [(a.process.pid, a.lease) for a in found] == [
        (job.pid, 7),
        (job.child, 7),
        (outsider, None),
    ]
    assert {(a.uid, a.user) for a in found} == {(os.getuid(), pwd.getpwuid(os.getuid()).pw_name)}


def test_a_job_belongs_by_process_group_and_by_reported_pid() -> None:
    with running_job() as job:
        by_group = LeaseProcs(3, frozenset({GPU}), pgid=job.pid)
        by_pid = LeaseProcs(4, frozenset({GPU}), pids=frozenset({job.pid}))
        assert {a.lease for a in attribute(on_gpu(job.child), [by_group], ProcFS())} == {3}
        assert {a.lease for a in attribute(on_gpu(job.child), [by_pid], ProcFS())} == {4}


@dataclass
class Table:
    """A process table: pid -> (ppid, pgid, sid, uid)."""

    rows: dict[int, tuple[int, int, int, int]]

    def stat(self, pid: int) -> ProcStat | None:
        row = self.rows.get(pid)
        return None if row is None else ProcStat(pid, *row[:3])

    def uid(self, pid: int) -> int | None:
        row = self.rows.get(pid)
        return None if row is None else row[3]

    def ns_ids(self, pid: int) -> NsIds | None:
        return None


# 10 is a client (pid reported by lease 1); 11 its child; 12 a grandchild in the session of
# lease 2's job (20), which is nearer than 10 for it; 30 a user's own process.
TABLE = Table(
    {
        10: (1, 10, 10, 1000),
        11: (10, 10, 10, 1000),
        12: (11, 20, 20, 1000),
        20: (1, 20, 20, 1001),
        30: (1, 30, 30, 1002),
    }
)


def name(uid: int) -> str:
    return f"user{uid}"


def test_the_nearest_matching_ancestor_wins() -> None:
    leases = [LeaseProcs(1, pids=frozenset({10})), LeaseProcs(2, sid=20)]
    found = attribute(on_gpu(11, 12, 30), leases, TABLE, name)
    assert [(a.lease, a.uid, a.user) for a in found] == [
        (1, 1000, "user1000"),
        (2, 1000, "user1000"),
        (None, 1002, "user1002"),
    ]


def test_a_client_with_two_leases_has_each_gpu_counted_under_the_lease_holding_it() -> None:
    leases = [LeaseProcs(5, frozenset({GPU}), pids=frozenset({10})),
              LeaseProcs(4, frozenset({OTHER}), pids=frozenset({10}))]  # fmt: skip
    found = attribute(
        [*on_gpu(11), *on_gpu(11, gpu=OTHER), *on_gpu(11, gpu="GPU-x")], leases, TABLE
    )
    assert [a.lease for a in found] == [5, 4, 4]  # on a GPU neither holds: the lowest id


def test_a_gone_process_or_a_loop_in_the_table_ends_the_walk() -> None:
    looped = Table({50: (51, 50, 50, 0), 51: (50, 51, 51, 0)})
    found = attribute(on_gpu(50, 99), [LeaseProcs(1, sid=77)], looped, name)
    assert [(a.lease, a.uid, a.user) for a in found] == [(None, 0, "user0"), (None, None, "")]
    assert [(a.outside, a.unknown) for a in found] == [(True, False), (False, True)]
    reported = attribute(on_gpu(99), [LeaseProcs(1, pids=frozenset({99}))], looped, name)
    assert reported[0].lease == 1  # a reported pid needs no /proc


def attributed(pid: int, lease: int | None, gpu: str, mib: int | None) -> Attributed:
    return Attributed(GPUProcess(pid, gpu, mib), lease, 0, "root")


def test_outside_and_lease_memory_add_up_and_unknown_stays_unknown() -> None:
    sample = Sample(
        "nvml",
        (
            GPUReading(GPU, 1000, 0, 0, ()),
            GPUReading(OTHER, 1000, 0, 0, ()),
            GPUReading("GPU-lost", 1000, 0, 0, None),
            GPUReading("GPU-idle", 1000, 0, 0, ()),
        ),
    )
    found = [
        attributed(1, None, GPU, 100),
        attributed(2, None, GPU, 50),
        attributed(3, None, OTHER, None),
        attributed(4, 9, GPU, 300),
        attributed(5, 9, GPU, 20),
        attributed(6, 9, OTHER, None),
    ]
    assert outside_mib(sample, found) == {GPU: 150, OTHER: None, "GPU-lost": None, "GPU-idle": 0}
    assert lease_use_mib(found) == {(9, GPU): 320, (9, OTHER): None}


def test_a_pid_that_names_no_process_here_is_unknown_not_outside_the_queue() -> None:
    """Inside a container the driver reports host pids (NVML and nvidia-smi do not translate
    them: NVIDIA/nvidia-docker#1483), which name no process in the container's pid
    namespace. Such a GPU process is unknown: not outside the queue, its memory not counted
    as outside; a reported pid still matches it (no /proc needed)."""
    foreign = absent_pid()
    sample = Sample("nvml", (GPUReading(GPU, 81920, 0, 0, ()),))
    with bystander() as outsider:
        found = attribute(on_gpu(foreign, outsider, mib=4000), [], ProcFS())
        assert [(a.process.pid, a.lease, a.unknown, a.outside) for a in found] == [
            (foreign, None, True, False),
            (outsider, None, False, True),
        ]
        assert outside_mib(sample, found) == {GPU: 4000}  # the bystander's alone
    assert outside_mib(sample, found[:1]) == {GPU: 0}
    reported = attribute(on_gpu(foreign), [LeaseProcs(3, pids=frozenset({foreign}))], ProcFS())
    assert [(a.lease, a.unknown, a.outside) for a in reported] == [(3, False, False)]


def test_procfs_reads_the_ids_of_a_process_in_its_own_pid_namespace(tmp_path: Path) -> None:
    """``NSpid:``, ``NSpgid:`` and ``NSsid:`` (proc(5)): the last entry is the id in the
    process's own namespace; this process, in the namespace of the procfs, has one entry."""
    me = ProcFS().ns_ids(os.getpid())
    assert me == NsIds(os.stat("/proc/self/ns/pid").st_ino, os.getpid(), os.getpgrp(),
                       os.getsid(0))  # fmt: skip
    (tmp_path / "42" / "ns").mkdir(parents=True)
    (tmp_path / "42" / "ns" / "pid").write_text("")
    (tmp_path / "42" / "status").write_text(
        "Name:\tx\nNStgid:\t42\t7\nNSpid:\t42\t7\nNSpgid:\t40\t5\nNSsid:\t30\t0\n"
    )
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "status").write_text("Name:\told kernel\nUid:\t0\t0\t0\t0\n")
    procs = ProcFS(str(tmp_path))
    ns = os.stat(tmp_path / "42" / "ns" / "pid").st_ino
    assert procs.ns_ids(42) == NsIds(ns, 7, 5, 0) and procs.ns_ids(43) is None
    assert procs.ns_ids(44) is None


@pytest.mark.skipif(os.getuid() != 0, reason="unshare --pid needs root (CI runs as root)")
def test_a_process_in_a_container_matches_a_lease_by_its_pid_there() -> None:
    """Seen from the host's namespace, a process in a pid namespace of its own (a
    container's) is named by its host pid; a lease that knows it by its pid in that
    namespace (``pidns``) matches it through ``NSpid``. The same number in another namespace
    (this one, or a wrong ``pidns``) matches nothing: the process is outside the queue."""
    with nested_process() as proc:
        ids = ProcFS().ns_ids(proc.pid)
        assert ids is not None and (ids.ns, ids.pid) == (proc.ns, proc.inner)
        assert proc.pid != proc.inner
        leases = [
            LeaseProcs(1, pids=frozenset({proc.inner}), pidns=proc.ns),
            LeaseProcs(2, pids=frozenset({proc.inner})),
            LeaseProcs(3, pids=frozenset({proc.inner}), pidns=proc.ns + 1),
        ]
        found = attribute(on_gpu(proc.pid), leases, ProcFS())
        assert [(a.lease, a.outside) for a in found] == [(1, False)]
        found = attribute(on_gpu(proc.pid), leases[1:], ProcFS())
        assert [(a.lease, a.outside, a.unknown) for a in found] == [(None, True, False)]


def test_a_server_outside_the_hosts_pid_namespace_says_what_that_costs() -> None:
    """PROC_PID_INIT_INO (include/linux/proc_ns.h) is the host's pid namespace: nothing to
    say there, nor where the namespace cannot be read; any other gets the fix."""
    assert namespace_note(0xEFFFFFFC) == ""
    note = namespace_note(0xF0000123)
    assert "host pids" in note and "unknown" in note and "--pid=host" in note
