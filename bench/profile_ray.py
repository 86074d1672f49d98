"""Where a hwpool.ray task's time goes: the Ray hops it is made of, each timed alone.

On the 2 x 2 fake-GPU cluster of ``bench_ray.py``, one task at a time, best of 3 rounds of
``--tasks`` each: a plain Ray task; a call to an async actor; an async actor's call to another;
a task launched and awaited by an async actor (the client actor's hop, without hwpool), by a
threaded actor, and by an async actor ten in one call (the launch alone, without the call); and
hwpool.ray tasks with a kept lease (the default: lent to the driver, which launches the task
itself), with a kept lease that the client uses (through a copy of the pool, which is never
lent one), without one (``keep_s=0``: a request and a release per task) and with a fresh worker
per task. Run: ``python bench/profile_ray.py``.

``--mix``: instead, the CPU time each kind of process spends on ``bench_ray.py``'s 20 ms mix
(read from ``/proc`` before and after, Linux only), for hwpool.ray and for plain Ray: where a
mix of short tasks through the queue spends its time on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ray

SEVERAL = 10


def noop() -> int:
    return 1


class Echo:
    """An async actor like the client: it answers, calls another, or launches a task."""

    async def ping(self) -> int:
        return 1

    async def relay(self, other: Any) -> int:
        return int(await other.ping.remote())

    async def launch(self, task: Any) -> int:
        return int(await task.remote())

    async def launch_several(self, task: Any, count: int) -> int:
        for _ in range(count):
            await task.remote()
        return count


class Blocking:
    """A threaded actor: launches a task and blocks on its result (no event loop)."""

    def launch(self, task: Any) -> int:
        import ray  # noqa: PLC0415

        return int(ray.get(task.remote()))


def timed(label: str, once: Callable[[], object], tasks: int, per: int = 1) -> str:
    """The best of 3 rounds of ``tasks`` calls of ``once``, per call (per task if each call
    runs ``per`` tasks)."""
    once()  # warm
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(tasks):
            once()
        best = min(best, (time.perf_counter() - start) / (tasks * per))
    return f"{label:<58}{best * 1e3:8.2f} ms"


def submitter(pool: Any) -> Callable[[], object]:
    import ray  # noqa: PLC0415

    return lambda: ray.get(pool.submit(noop, fraction=0.25))


def hops(tasks: int) -> list[str]:
    import ray  # noqa: PLC0415

    import hwpool.ray  # noqa: PLC0415

    share = ray.remote(noop).options(num_gpus=0.25, num_cpus=0)
    bare = ray.remote(noop).options(num_gpus=0, num_cpus=0)
    actor = ray.remote(num_cpus=0)(Echo)
    a, b = actor.remote(), actor.remote()
    blocking = ray.remote(num_cpus=0, max_concurrency=4)(Blocking).remote()
    rows = [
        timed("plain Ray task, num_gpus=0.25", lambda: ray.get(share.remote()), tasks),
        timed("driver -> async actor call", lambda: ray.get(a.ping.remote()), tasks),
        timed("driver -> async actor -> actor call", lambda: ray.get(a.relay.remote(b)), tasks),
        timed(
            "driver -> async actor -> task (no hwpool)",
            lambda: ray.get(a.launch.remote(bare)),
            tasks,
        ),
        timed(
            "driver -> threaded actor -> task (no hwpool)",
            lambda: ray.get(blocking.launch.remote(bare)),
            tasks,
        ),
        timed(
            f"async actor -> task, {SEVERAL} in one call (per task)",
            lambda: ray.get(a.launch_several.remote(bare, SEVERAL)),
            max(1, tasks // SEVERAL),
            per=SEVERAL,
        ),
    ]
    for label, options in (
        ("hwpool.ray fraction=0.25, kept lease lent (default)", {}),
        ("hwpool.ray fraction=0.25, kept lease, through the client", {"copy": True}),
        ("hwpool.ray fraction=0.25, keep_s=0 (request+release)", {"keep_s": 0}),
        ("hwpool.ray fraction=0.25, reuse_workers=False", {"reuse_workers": False}),
    ):
        copy = bool(options.pop("copy", False))
        pool = hwpool.ray.connect(namespace=f"hops-{len(rows)}", **options)
        try:
            count = 3 if "reuse_workers" in options else tasks
            # A copy of the pool (as a task gets) calls the client without the driver's order,
            # so the client never lends it a lease: the task goes through the client.
            user = ray.cloudpickle.loads(ray.cloudpickle.dumps(pool)) if copy else pool
            rows.append(timed(label, submitter(user), count))
        finally:
            pool.close()
    return rows


KINDS = (
    ("ray::SchedulerActor", "hwpool scheduler actor"),
    ("ray::ClientActor", "hwpool client actor"),
    ("gcs_server", "Ray GCS"),
    ("raylet", "Ray raylets"),
    ("ray::", "Ray workers (the tasks)"),
)


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Each process's kind (this one is the driver) and CPU seconds used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(entry) == os.getpid():
            kind = "driver"
        else:
            kind = next((name for mark, name in KINDS if mark in cmdline), "other")
        used[int(entry)] = (kind, (int(fields[11]) + int(fields[12])) / tick)
    return used


def spent_by_kind(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds each kind of process used between two readings: processes alive at the
    second (those started meanwhile for all their time); those that ended are not counted."""
    spent: dict[str, float] = {}
    for pid, (kind, seconds) in after.items():
        earlier = before.get(pid)
        start = earlier[1] if earlier is not None and earlier[0] == kind else 0.0
        spent[kind] = spent.get(kind, 0.0) + seconds - start
    return spent


def started_by_kind(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, int]:
    """How many processes of each kind started between two readings (and still run)."""
    started: dict[str, int] = {}
    for pid, (kind, _) in after.items():
        if pid not in before:
            started[kind] = started.get(kind, 0) + 1
    return started


def mix_cpu() -> list[str]:
    """CPU time per task of each kind of process over the 20 ms mix, per contender (after a
    warm-up round each). Processes that end during the mix are not counted."""
    import hwpool.ray  # noqa: PLC0415

    scale = bench_ray.FULL
    pool = hwpool.ray.connect(namespace="mix-cpu")
    contenders = {"hwpool.ray": bench_ray.hwpool_submitter(pool), "Ray": bench_ray.ray_submitter()}
    rows = []
    try:
        for name, submit in contenders.items():
            bench_ray.mixed(submit, scale)  # warm
            before, start = cpu_by_process(), time.perf_counter()
            makespan = bench_ray.mixed(submit, scale)["makespan"]
            wall, after = time.perf_counter() - start, cpu_by_process()
            tasks = scale.small + scale.large
            spent = spent_by_kind(before, after)
            total = sum(spent.values())
            rows.append(
                f"{name}: makespan {makespan:.2f} s; CPU {total:.2f} s over {wall:.2f} s "
                f"({total / wall:.2f} cores), {total / tasks * 1e3:.1f} ms per task:"
            )
            started = started_by_kind(before, after)
            for kind, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
                if seconds > 0:
                    new = f" ({started[kind]} started meanwhile)" if started.get(kind) else ""
                    rows.append(f"  {kind:<28}{seconds / tasks * 1e3:7.2f} ms per task{new}")
    finally:
        pool.close()
    return rows


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=30, help="tasks per round")
    parser.add_argument("--mix", action="store_true", help="CPU per process kind on the mix")
    args = parser.parse_args(argv)
    with bench_ray.local_cluster():
        return "\n".join(mix_cpu() if args.mix else hops(args.tasks))


if __name__ == "__main__":
    print(main())
