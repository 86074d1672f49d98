"""The job table (issue 24's aims): adding 500 jobs, listing them, and the memory it takes.

Each figure is an absolute aim of the issue, printed beside it: submitting 500 jobs under
10 s in all, ``hwpool jobs`` over 500 queued jobs under 200 ms, the supervisor under 50 MiB.
Adding is ``JobStore.add`` (one durable transaction each, the environment of this process
as each job's), listing is opening the table and reading every queued job, and the memory
is this process's resident set after both (Python, hwpool's modules and sqlite: an upper
bound for what the supervisor's table costs it). The last row is what ``hwpool jobs`` does
once started, in this process: open the table, list every job, format the table (Python's
start and hwpool's imports, a few hundred ms, are not in it). The table is
a new one in a temporary directory, removed afterwards.

Run: ``python bench/bench_jobs.py`` (500 jobs, listing best of 5), ``--quick`` (100 jobs,
best of 2), or ``--jobs N``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from hwpool._jobs._handle import open_table
from hwpool._jobs._store import JobStore

AIM_ADD_S = 10.0
AIM_LIST_MS = 200.0
AIM_RSS_MIB = 50.0


def add_jobs(directory: Path, count: int) -> float:
    """Seconds to add ``count`` jobs to a new table in ``directory``, each in its own
    committed transaction."""
    environment = dict(os.environ)
    began = time.perf_counter()
    with JobStore.open(directory) as store:
        for index in range(count):
            store.add(
                ["python", "train.py", f"--seed={index}"], cwd="/srv/work",
                environment=environment, gpus=0.25, name=f"seed {index}",
            )  # fmt: skip
    return time.perf_counter() - began


def list_jobs(directory: Path, count: int) -> float:
    """Milliseconds to open the table and list its queued jobs (``hwpool jobs``)."""
    began = time.perf_counter()
    with JobStore.open(directory) as store:
        listed = store.list()
    elapsed = (time.perf_counter() - began) * 1000
    assert len(listed) == count, len(listed)
    return elapsed


def show_jobs(directory: Path, count: int) -> float:
    """Milliseconds for what ``hwpool jobs`` does once started: open the table, list every
    job and format the table (``--json`` costs about the same)."""
    # imported here, after the memory was measured: the command's modules are not the
    # supervisor's
    format_jobs = importlib.import_module("hwpool._cli._jobs_cmds").format_jobs
    now = time.time()
    began = time.perf_counter()
    store = open_table(directory)
    assert store is not None
    with store:
        rows = [("me", job) for job in store.list(include_finished=True)]
    text = format_jobs(rows, now, with_user=False, all_shown=False)
    elapsed = (time.perf_counter() - began) * 1000
    assert text.count("\n") == count + 1, text[-200:]
    return elapsed


def resident_mib() -> float:
    """This process's resident set size now, in MiB (``VmRSS``)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def table(count: int, rounds: int) -> str:
    """Run the three measurements and return the table."""
    directory = Path(tempfile.mkdtemp(prefix="hwpool-bench-jobs-")) / "state"
    try:
        add_s = add_jobs(directory, count)
        list_ms = min(list_jobs(directory, count) for _ in range(max(1, rounds)))
        size_kib = sum(path.stat().st_size for path in directory.iterdir()) / 1024
        rss = resident_mib()
        show_ms = min(show_jobs(directory, count) for _ in range(max(1, rounds)))
    finally:
        shutil.rmtree(directory.parent, ignore_errors=True)
    rows = [
        (f"add {count} jobs (total)", f"{add_s:.2f} s", f"< {AIM_ADD_S:g} s for 500"),
        (f"open + list {count} jobs (best of {rounds})", f"{list_ms:.1f} ms",
         f"< {AIM_LIST_MS:g} ms for 500"),
        ("resident memory after (this process)", f"{rss:.1f} MiB",
         f"< {AIM_RSS_MIB:g} MiB (the supervisor)"),
        ("table file on disk", f"{size_kib:.0f} KiB", ""),
        (f"hwpool jobs: open, list, format {count}", f"{show_ms:.1f} ms",
         f"< {AIM_LIST_MS:g} ms for 500"),
    ]  # fmt: skip
    lines = [
        f"job table: {count} jobs, {len(os.environ)} environment variables each, sqlite "
        f"{sqlite3.sqlite_version} in WAL mode, synchronous=FULL "
        f"(Python {platform.python_version()}, {platform.machine()})",
        f"{'measure':<40}{'result':>12}  aim",
        *(f"{what:<40}{result:>12}  {aim}".rstrip() for what, result, aim in rows),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its table and return the table text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 jobs, best of 2")
    parser.add_argument("--jobs", type=int, help="how many jobs (default 500)")
    args = parser.parse_args(argv)
    count = args.jobs or (100 if args.quick else 500)
    result = table(count, 2 if args.quick else 5)
    print(result)
    return result


if __name__ == "__main__":
    main()
