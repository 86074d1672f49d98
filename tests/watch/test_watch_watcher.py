"""One watcher step end to end: a fake NVML reporting real processes (a job on a lease, and
a process outside the queue), the hysteresis and the over-lease flag together."""

from __future__ import annotations

from watchprocs import absent_pid, bystander, running_job

from fakes.live_nvml import FakeNVML, LiveGPU
from hwpool._watch import (
    HoldRule,
    LeaseProcs,
    LeaseShare,
    NvmlSampler,
    OverLeasePolicy,
    Watcher,
)

A, B = "GPU-aaaa", "GPU-bbbb"


def test_an_outside_process_is_withheld_while_it_stays_and_a_greedy_job_is_flagged() -> None:
    nvml = FakeNVML([LiveGPU(A, 81920), LiveGPU(B, 24576)])
    watcher = Watcher(NvmlSampler(nvml), rule=HoldRule(take_samples=2, give_samples=2), grace_s=4)
    with running_job() as job, bystander() as outsider:
        lease = [LeaseProcs(1, frozenset({A}), sid=job.pid)]
        share = [LeaseShare(1, A, memory_mib=1000, policy=OverLeasePolicy.TERM)]
        nvml.gpus[0].processes = {job.pid: 500, job.child: 3000}  # the job's child: its lease
        nvml.gpus[1].processes = {outsider: 5000}
        reports = [watcher.observe(lease, share, now) for now in (0.0, 2.0, 4.0)]
        del nvml.gpus[1].processes[outsider]
        reports += [watcher.observe(lease, share, now) for now in (6.0, 8.0)]
    assert [r.withheld_mib for r in reports] == [{A: 0, B: 0}, {A: 0, B: 5000}, {A: 0, B: 5000},
                                                 {A: 0, B: 5000}, {A: 0, B: 0}]  # fmt: skip
    first = reports[0]
    assert [(p.process.pid, p.lease) for p in first.processes] == [
        (job.pid, 1), (job.child, 1), (outsider, None)]  # fmt: skip
    assert [(p.process.pid, p.process.gpu, p.process.used_mib) for p in first.outside] == [
        (outsider, B, 5000)]  # fmt: skip
    flags = [[(f.used_mib, f.allowed_mib, f.warn, f.end) for f in r.over] for r in reports]
    assert flags[:4] == [[(3500, 1000, True, False)], [(3500, 1000, False, False)],
                         [(3500, 1000, False, True)], [(3500, 1000, False, False)]]  # fmt: skip
    watcher.close()
    assert nvml.shutdowns == 1


def test_a_failed_sample_changes_nothing() -> None:
    nvml = FakeNVML([LiveGPU(A, 81920)])
    watcher = Watcher(NvmlSampler(nvml), rule=HoldRule(take_samples=1, give_samples=1))
    with bystander() as outsider:
        nvml.gpus[0].processes = {outsider: 4000}
        assert watcher.observe([], [], 0.0).withheld_mib == {A: 4000}
        nvml.gpus[0].failing["nvmlDeviceGetComputeRunningProcesses"] = "Unknown Error"
        failed = watcher.observe([], [], 1.0)
    assert failed.withheld_mib == {A: 4000} and failed.processes == ()
    assert "Unknown Error" in failed.sample.problem


def test_memory_of_a_pid_that_names_no_process_here_is_not_withheld() -> None:
    """Inside a container NVML reports host pids (NVIDIA/nvidia-docker#1483): a leased
    job's process reported under a pid that names nothing here was "used outside the queue"
    and its memory withheld from the queue. It is unknown now: not listed as outside, and
    nothing is withheld for it."""
    foreign = absent_pid()
    nvml = FakeNVML([LiveGPU(A, 81920, processes={foreign: 6000})])
    watcher = Watcher(NvmlSampler(nvml), rule=HoldRule(take_samples=1, give_samples=1))
    reports = [watcher.observe([], [], now) for now in (0.0, 1.0)]
    assert [r.withheld_mib for r in reports] == [{A: 0}, {A: 0}]
    assert reports[-1].outside == ()
    assert [(p.process.pid, p.unknown) for p in reports[-1].processes] == [(foreign, True)]
    watcher.close()
