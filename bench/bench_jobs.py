"""Jobs that outlive the terminal (issue 24's aims): 500 queued jobs of one user, end to end.

A real ``hwpool serve`` (one GPU) on a temporary socket and a temporary state directory. One
job holds the GPU (it waits for a file) so that the 500 submitted after it all queue; then:

- **submit**: ``hwpool.submit`` 500 times in this process (each one durable transaction in
  the table and one wake of the supervisor; the first also starts the supervisor), in all;
  and ``hwpool submit`` as a process, per job, beside a bare ``python -c pass`` measured in
  the same run (the interpreter's own start, which no command can go below);
- **list**: ``hwpool jobs`` over the 500 queued jobs, in this process (best of 5), and as a
  process beside the bare interpreter;
- **memory**: the supervisor's resident set (``VmRSS``) once it holds the 500 jobs (128 of
  them waiting in the server's queue, the rest in the table);
- **submit from a shell**: ``hwpool submit --from FILE`` with 500 lines, one process, in all
  (a shell loop of 500 ``hwpool submit`` costs 500 interpreter starts: the per-process row).

Each figure is printed beside its absolute aim (the issue's: submit under 10 s in all, jobs
under 200 ms, the supervisor under 50 MiB). Everything is killed and removed afterwards.

Run: ``python bench/bench_jobs.py`` (500 jobs), ``--quick`` (100 jobs), or ``--jobs N``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hwpool import submit
from hwpool._cli import main as hwpool_main
from hwpool._jobs._model import JobState
from hwpool._jobs._store import JobStore
from hwpool._jobs._supervisor import LOCK_NAME, MAX_REQUESTS

AIM_SUBMIT_S = 10.0
AIM_LIST_MS = 200.0
AIM_RSS_MIB = 50.0
CLI_SAMPLES = 5
BOUND_S = 120.0


@contextlib.contextmanager
def box() -> Iterator[tuple[Path, dict[str, str]]]:
    """A server with one GPU and a state directory; their folder and the environment."""
    folder = Path(tempfile.mkdtemp(prefix="hwb", dir="/tmp"))
    env = {
        **os.environ, "HWPOOL_SOCKET": str(folder / "s.sock"),
        "HWPOOL_STATE_DIR": str(folder / "state"), "HWPOOL_AUTOSTART": "0",
        "HWPOOL_SYSTEM_SOCKET": "",
    }  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "hwpool", "serve", "--socket", env["HWPOOL_SOCKET"], "--gpus", "1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if "serving" in line:
                break
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            yield folder, env
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    finally:
        _kill_jobs(folder / "state")
        server.kill()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _kill_jobs(state: Path) -> None:
    """SIGKILL the supervisor and the launchers of ``state`` (their process groups)."""
    pids = [_supervisor_pid(state)]
    with contextlib.suppress(Exception), JobStore.open(state) as store:
        pids += [job.pid for job in store.list(states=[JobState.RUNNING])]
    for pid in pids:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _supervisor_pid(state: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((state / LOCK_NAME).read_text().split()[0])
    return None


def submit_all(folder: Path, count: int) -> float:
    """Seconds to submit ``count`` jobs with ``hwpool.submit`` (after one that holds the GPU)."""
    blocker = submit(["sh", "-c", f"while [ ! -e {folder}/go ]; do sleep 0.1; done"])
    deadline = time.monotonic() + BOUND_S
    while blocker.state is not JobState.RUNNING:  # the GPU is held: all that follow queue
        if time.monotonic() > deadline:
            raise AssertionError(f"the first job never ran: {blocker.record()}")
        time.sleep(0.05)
    began = time.perf_counter()
    for index in range(count):
        submit(["true", str(index)], gpus=1, name=f"seed {index}")
    return time.perf_counter() - began


def seconds_of_process(argv: list[str], env: dict[str, str]) -> float:
    """The best of CLI_SAMPLES wall times of running ``argv``."""
    best = float("inf")
    for _ in range(CLI_SAMPLES):
        began = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=BOUND_S)
        best = min(best, time.perf_counter() - began)
    return best


def list_in_process(count: int) -> float:
    """Milliseconds of ``hwpool jobs`` in this process (best of 5), output discarded."""
    best = float("inf")
    for _ in range(5):
        out = io.StringIO()
        began = time.perf_counter()
        with contextlib.redirect_stdout(out):
            code = hwpool_main(["jobs"])
        best = min(best, (time.perf_counter() - began) * 1000)
        assert code == 0
    assert out.getvalue().count("queued") >= count, out.getvalue()[-500:]
    return best


def supervisor_mib(state: Path, count: int) -> float:
    """The supervisor's resident set once ``count`` jobs are queued and it asked for as many
    as it keeps in the server's queue."""
    pid = _supervisor_pid(state)
    assert pid is not None, "no supervisor runs"
    deadline = time.monotonic() + BOUND_S
    wanted = min(count, MAX_REQUESTS)
    while _waiting_in_server() < wanted:
        if time.monotonic() > deadline:
            raise AssertionError(f"the supervisor never queued {wanted} requests")
        time.sleep(0.1)
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _waiting_in_server() -> int:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        hwpool_main(["status", "--json"])
    return len(json.loads(out.getvalue())["waiting"])


def run(count: int) -> str:
    """Measure everything (see the module); the table."""
    rows: list[tuple[str, str, str]] = []
    with box() as (folder, env):
        total = submit_all(folder, count)
        rows.append((f"hwpool.submit x {count} (in all)", f"{total:.2f} s", "< 10 s for 500"))
        rows.append(("  per job", f"{total / count * 1000:.1f} ms", ""))
        listed = list_in_process(count)
        rows.append((f"hwpool jobs, {count} queued (in-process)", f"{listed:.0f} ms",
                     "< 200 ms for 500"))  # fmt: skip
        bare = seconds_of_process([sys.executable, "-c", "pass"], env)
        jobs = seconds_of_process([sys.executable, "-m", "hwpool", "jobs"], env)
        rows.append(("hwpool jobs as a process", f"{jobs * 1000:.0f} ms",
                     f"python -c pass: {bare * 1000:.0f} ms ({jobs / bare:.1f}x)"))  # fmt: skip
        one = seconds_of_process([sys.executable, "-m", "hwpool", "submit", "--", "true"], env)
        rows.append(("hwpool submit as a process (one job)", f"{one * 1000:.0f} ms",
                     f"python -c pass: {bare * 1000:.0f} ms ({one / bare:.1f}x)"))  # fmt: skip
        rss = supervisor_mib(folder / "state", count)
        rows.append((f"supervisor RSS, {count} queued", f"{rss:.1f} MiB", "< 50 MiB"))
        listing = folder / "commands.txt"
        listing.write_text("".join(f"true {index}\n" for index in range(count)))
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hwpool", "submit", "--from", str(listing)],
                       env=env, check=True, capture_output=True, timeout=BOUND_S)  # fmt: skip
        batch = time.perf_counter() - began
        rows.append((f"hwpool submit --from FILE, {count} lines", f"{batch:.2f} s",
                     "< 10 s for 500"))  # fmt: skip
    width = max(len(row[0]) for row in rows)
    lines = [
        f"# jobs: {count} queued jobs of one user (Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs)",
        f"{'measure':<{width}}  {'result':>10}  aim",
        *(f"{name:<{width}}  {result:>10}  {aim}".rstrip() for name, result, aim in rows),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print its table and return the table text."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 jobs")
    parser.add_argument("--jobs", type=int, help="how many jobs (default 500)")
    args = parser.parse_args(argv)
    count = args.jobs or (100 if args.quick else 500)
    result = run(count)
    print(result)
    return result


if __name__ == "__main__":
    main()
