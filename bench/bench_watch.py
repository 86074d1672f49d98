"""The GPU watcher's cost: CPU time per sample, as a share of one core at its interval.

One watcher step (sample the GPUs, map each GPU process to a lease through /proc, update the
outside-memory hysteresis and the over-lease flags) over 8 GPUs and 100 GPU processes: 80
real processes in 8 leases (one process group each, on the lease's GPU) and 20 outside the
queue (whose parent chains are walked up to init). The GPUs are a fake NVML in this file (the
cost of real NVML calls is not in the figure; nvidia-smi, the fallback, costs a process start
per query and far more). Each figure is the median CPU time (``time.process_time``) of the
timed samples, and its share of one core at a sample every ``--interval`` seconds (2 s).
Aim: the whole step under 1% of one core.

Run: ``python bench/bench_watch.py`` (a few seconds), or ``--quick`` for 2 GPUs and 10
processes, 20 samples (a smoke run).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import subprocess
import time
import types
from collections.abc import Callable, Iterator
from fractions import Fraction

from hwpool._watch import (
    HoldRule,
    LeaseProcs,
    LeaseShare,
    NvmlSampler,
    ProcFS,
    Watcher,
    attribute,
)

GPUS, PROCESSES, SAMPLES = 8, 100, 200
QUICK_GPUS, QUICK_PROCESSES, QUICK_SAMPLES = 2, 10, 20
OUTSIDE_SHARE = 0.2  # of the processes, outside the queue
INTERVAL_S = 2.0
MIB = 2**20


class BenchNVML(types.ModuleType):
    """A fixed machine behind pynvml's calls: ``gpus`` maps a UUID to its processes' MiB."""

    def __init__(self, gpus: dict[str, dict[int, int]]) -> None:
        super().__init__("pynvml")
        self.gpus = list(gpus.items())

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple[str, dict[int, int]]:
        return self.gpus[i]

    def nvmlDeviceGetMigMode(self, gpu: object) -> tuple[int, int]:
        return (0, 0)

    def nvmlDeviceGetUUID(self, gpu: tuple[str, dict[int, int]]) -> str:
        return gpu[0]

    def nvmlDeviceGetMemoryInfo(self, gpu: tuple[str, dict[int, int]]) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=81920 * MIB, used=sum(gpu[1].values()) * MIB)

    def nvmlDeviceGetUtilizationRates(self, gpu: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=50, memory=20)

    def nvmlDeviceGetComputeRunningProcesses(
        self, gpu: tuple[str, dict[int, int]]
    ) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m * MIB) for p, m in gpu[1].items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: object) -> list[types.SimpleNamespace]:
        return []


@contextlib.contextmanager
def processes(gpus: int, count: int) -> Iterator[tuple[list[LeaseProcs], list[int]]]:
    """``count`` sleeping processes: the leased ones in one process group per GPU (the
    leases), the rest children of this one (outside). Ended on exit."""
    started: list[subprocess.Popen[bytes]] = []
    leased = count - round(count * OUTSIDE_SHARE)
    try:
        leaders = [_sleeper(started, 0) for _ in range(gpus)]
        members = [_sleeper(started, leaders[i % gpus]) for i in range(leased - gpus)]
        outside = [_sleeper(started, None) for _ in range(count - leased)]
        leases = [LeaseProcs(i, frozenset({_uuid(i)}), pgid=pid) for i, pid in enumerate(leaders)]
        yield leases, [*leaders, *members, *outside]
    finally:
        for proc in started:
            proc.kill()
        for proc in started:
            proc.wait()


def _sleeper(started: list[subprocess.Popen[bytes]], group: int | None) -> int:
    proc = subprocess.Popen(["sleep", "600"], process_group=group)
    started.append(proc)
    return proc.pid


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-bench"


def measure(gpus: int, count: int, samples: int) -> dict[str, float]:
    """Median CPU seconds per sample of: the NVML sample, the attribution, the whole step."""
    with processes(gpus, count) as (leases, pids):
        machine = {_uuid(i): {} for i in range(gpus)}  # type: dict[str, dict[int, int]]
        for i, pid in enumerate(pids):
            machine[_uuid(i % gpus)][pid] = 1000 + i
        sampler = NvmlSampler(BenchNVML(machine))
        shares = [LeaseShare(i, _uuid(i), fraction=Fraction(1, 2)) for i in range(gpus)]
        watcher = Watcher(sampler, rule=HoldRule(), grace_s=30.0)
        sample = sampler.sample()
        assert len(sample.processes) == count, sample.problem
        procs = ProcFS()
        clock = iter(range(10**9))
        return {
            "sample": _median_cpu(sampler.sample, samples),
            "attribution": _median_cpu(lambda: attribute(sample.processes, leases, procs), samples),
            "step": _median_cpu(
                lambda: watcher.observe(leases, shares, next(clock) * 2.0), samples
            ),
        }


def _median_cpu(work: Callable[[], object], samples: int) -> float:
    work()  # warm: the user-name cache, the first /proc reads
    times = []
    for _ in range(samples):
        begin = time.process_time()
        work()
        times.append(time.process_time() - begin)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark and return its table (also printed when run as a script)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 GPUs, 10 processes, 20 samples")
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds (2)")
    args = parser.parse_args(argv)
    gpus, count, samples = (
        (QUICK_GPUS, QUICK_PROCESSES, QUICK_SAMPLES) if args.quick else (GPUS, PROCESSES, SAMPLES)
    )
    cost = measure(gpus, count, samples)
    outside = round(count * OUTSIDE_SHARE)
    lines = [
        f"GPU watcher cost  (Python {platform.python_version()}, {platform.machine()}; "
        f"{gpus} GPUs, {count} GPU processes: {count - outside} on {gpus} leases, {outside} "
        f"outside; fake NVML; median of {samples} samples)",
        f"{'part of one step':<40}{'CPU ms/sample':>14}{'% of one core':>15}  aim",
    ]
    rows = [
        ("NVML sample (fake NVML)", "sample", ""),
        ("attribution (/proc walks)", "attribution", ""),
        ("whole watcher step", "step", "  < 1%"),
    ]
    for label, key, aim in rows:
        share = 100 * cost[key] / args.interval
        lines.append(f"{label:<40}{cost[key] * 1e3:>14.3f}{share:>14.3f}%{aim}")
    lines.append(f"(one sample every {args.interval:g} s)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
