"""Which lease a GPU process belongs to: /proc as read, and the mapping, with real processes
(a job in its own session, its child in another) and with a table of processes."""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from watchprocs import bystander, running_job

from hwpool._watch import (
    Attributed,
    GPUProcess,
    GPUReading,
    LeaseProcs,
    ProcFS,
    ProcStat,
    Sample,
    attribute,
    lease_use_mib,
    outside_mib,
)

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
