"""Benchmark CPUPool against the standard thread pools and against NumPy's own BLAS threading.

Prints one table, with every baseline measured in the same run on the same machine:

- the round-trip latency of an empty job (one task per participant, wait for all) on
  ``CPUPool.run``, ``concurrent.futures.ThreadPoolExecutor`` and
  ``multiprocessing.pool.ThreadPool``, plus ``CPUPool`` at a few spin budgets;
- the throughput, in GB/s of weights read, of a float32 4096x4096 matrix-vector product split
  by rows with ``CPUPool.run_rows`` (BLAS held to one thread with threadpoolctl), against one
  NumPy call with single-threaded BLAS, one with BLAS on all cores of the team, and the same
  split with 0.1's fixed 256-row ranges (no finer tail).

Run as ``python bench/bench_cpu_pool.py [--quick]``; ``main()`` returns the table text.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from multiprocessing.pool import ThreadPool

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

import hwpool

MATRIX_ROWS = MATRIX_COLS = 4096
SPINS = (0, 100, 1000, 10_000)


def _noop(*_: object) -> None:
    return None


def _per_call_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    """Median over ``repeats`` batches of the mean time of one call, in microseconds."""
    for _ in range(min(calls, 200)):
        call()
    batches = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        batches.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(batches)


def _latencies(team: int, calls: int, repeats: int) -> dict[str, float]:
    results: dict[str, float] = {}
    for spin in SPINS:
        with hwpool.CPUPool(team - 1, spin=spin) as pool:
            results[f"CPUPool.run (spin={spin})"] = _per_call_us(
                lambda pool=pool: pool.run(_noop), calls, repeats
            )
    with ThreadPoolExecutor(max_workers=team) as executor:

        def tpe() -> None:
            wait([executor.submit(_noop) for _ in range(team)])

        results["ThreadPoolExecutor"] = _per_call_us(tpe, calls, repeats)
    with ThreadPool(team) as thread_pool:
        results["multiprocessing ThreadPool"] = _per_call_us(
            lambda: thread_pool.map(_noop, range(team), chunksize=1), calls, repeats
        )
    return results


_ALL_CORE_CHILD = """
import statistics, sys, time
import numpy as np
from threadpoolctl import threadpool_limits
rows, cols, team, repeats = map(int, sys.argv[1:5])
rng = np.random.default_rng(0)
weights = rng.standard_normal((rows, cols), dtype=np.float32)
x = rng.standard_normal(cols, dtype=np.float32)
out = np.empty(rows, dtype=np.float32)
times = []
with threadpool_limits(team):
    np.dot(weights, x, out=out)
    for _ in range(repeats):
        start = time.perf_counter()
        np.dot(weights, x, out=out)
        times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def _all_core_numpy(team: int, repeats: int) -> float:
    """Median seconds of one NumPy matvec with BLAS on ``team`` threads, in a child process.

    Once OpenBLAS has run multi-threaded in a process, its idle threads keep competing with
    other threads there (measured: a CPUPool split fell from about 48 to 25-31 GB/s on 2 cores,
    even seconds later), so this baseline gets a process of its own.
    """
    argv = [str(MATRIX_ROWS), str(MATRIX_COLS), str(team), str(repeats)]
    result = subprocess.run(
        [sys.executable, "-c", _ALL_CORE_CHILD, *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(result.stdout)


def _matvec(team: int, repeats: int) -> dict[str, float]:
    """Seconds per 4096x4096 float32 matvec, median of ``repeats``, three ways.

    NumPy with one BLAS thread and the CPUPool split are timed in turns in this process; the
    all-core NumPy baseline runs between their two halves, in a child process.
    """
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((MATRIX_ROWS, MATRIX_COLS), dtype=np.float32)
    x = rng.standard_normal(MATRIX_COLS, dtype=np.float32)
    out = np.empty(MATRIX_ROWS, dtype=np.float32)

    def numpy_call() -> None:
        np.dot(weights, x, out=out)

    def rows(start: int, end: int) -> None:
        np.dot(weights[start:end], x, out=out[start:end])

    with hwpool.CPUPool(team - 1) as pool, threadpool_limits(1):
        methods: dict[str, Callable[[], object]] = {
            "NumPy, BLAS 1 thread": numpy_call,
            "CPUPool.run_rows, BLAS 1 thread": lambda: pool.run_rows(MATRIX_ROWS, rows),
            # The 0.1 default: 256-row ranges to the end (no finer tail), as an A/B baseline.
            "run_rows, grain=256 (0.1)": lambda: pool.run_rows(MATRIX_ROWS, rows, grain=256),
        }
        first = _interleaved(methods, repeats // 2)
        all_core = _all_core_numpy(team, repeats)
        second = _interleaved(methods, repeats - repeats // 2)
    medians = {name: statistics.median(first[name] + second[name]) for name in methods}
    medians[f"NumPy, BLAS {team} threads"] = all_core
    return medians


def _interleaved(methods: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each method, timed in turns so that noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(repeats):
        for name, call in methods.items():
            call()
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def _blas_line() -> str:
    parts = [
        f"{info.get('internal_api')} {info.get('version')} ({info.get('architecture')}, "
        f"{info.get('num_threads')} threads)"
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    ]
    return "BLAS: " + ("; ".join(parts) or "none found")


def _table(team: int, latency: dict[str, float], matvec: dict[str, float]) -> str:
    gigabytes = MATRIX_ROWS * MATRIX_COLS * 4 / 1e9
    tpe = latency["ThreadPoolExecutor"]
    lines = [
        f"hwpool CPUPool benchmark: team of {team} (workers + caller), "
        f"hwpool.effective_threads()={hwpool.effective_threads()}",
        _blas_line(),
        "",
        f"{'empty job round trip':<34}{'us/call':>10}{'vs TPE':>9}",
    ]
    lines += [f"{name:<34}{us:>10.1f}{us / tpe:>8.2f}x" for name, us in latency.items()]
    single = matvec["NumPy, BLAS 1 thread"]
    allcore = matvec[f"NumPy, BLAS {team} threads"]
    lines += ["", f"{'float32 4096x4096 matvec':<34}{'GB/s':>10}{'vs 1 thr':>9}{'vs all':>9}"]
    lines += [
        f"{name:<34}{gigabytes / s:>10.2f}{single / s:>8.2f}x{allcore / s:>8.2f}x"
        for name, s in matvec.items()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its table and return the table text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args(argv)
    calls, repeats = (200, 3) if args.quick else (3000, 7)
    team = max(2, hwpool.effective_threads())
    latency = _latencies(team, calls, repeats)
    matvec = _matvec(team, 5 if args.quick else 40)
    table = _table(team, latency, matvec)
    print(table)
    return table


if __name__ == "__main__":
    main()
