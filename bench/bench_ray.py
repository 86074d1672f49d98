"""hwpool.ray against plain Ray GPU tasks, in one run on a local 2 x 2 fake-GPU Ray cluster.

1. Mixed workload: 200 tasks of 20 ms at 0.25, 0.5 or 1 GPU plus 10 tasks of 2 whole GPUs,
   all submitted at once: makespan, GPU utilisation and its lower bound, the 2-GPU tasks'
   waits, and the most any one GPU was loaded at once (over 1.0 is a double-booked GPU).
   The same mix once more with tasks of 200 ms, where the per-task overhead matters less.
2. Starvation probe: one whole-node task (2 GPUs: a task is one process, so it cannot be
   larger than a node) behind 16 running 0.25-GPU tasks and a stream of 160 more submitted
   after it: its wait, and how many of the later tasks started before it. Run twice, the
   first unmeasured: a first probe waits for Ray to start worker processes for the small
   tasks granted ahead of the big one (1.2-2.9 s for hwpool.ray on this 2-vCPU VM), and
   Ray ends idle workers above a node's CPU count after a second.
3. Per-task overhead: one 0.25-GPU no-op task at a time, submit to result, 30 times.

After one warm-up round of each (so that both find their worker processes started), the mixed
workload and the overhead run 3 rounds in alternating order and the best of each is kept.

Plain Ray runs the same tasks with ``.options(num_gpus=share, num_cpus=0)`` (num_cpus=0 is its
best case: with its default of one CPU per task, a 1-CPU node runs one task at a time);
hwpool.ray runs them with kept leases (``keep_s=0.2``), ``num_cpus=0`` and
``reuse_across_gpus=True`` (these tasks never initialise CUDA), so that both reuse worker
processes across GPUs. Every Ray process binds 127.0.0.1
only (checked with ``ss`` when present).
Run: ``python bench/bench_ray.py`` (about 80 s on a 2-core VM) or ``hwpool bench ray``; needs
``hwpool[ray]``. (No dataclasses here: ``hwpool bench`` loads this file outside
``sys.modules``.)
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

# Ray turns a loopback address into the machine's outward one unless this is 0 (read when Ray
# is imported, inherited by every process it starts): the cluster must stay on 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

NODES, GPUS_PER_NODE = 2, 2
GPUS = NODES * GPUS_PER_NODE
NODE_ARGS: dict[str, Any] = {
    "node_ip_address": "127.0.0.1",
    "num_cpus": 1,
    "num_gpus": GPUS_PER_NODE,
    "object_store_memory": 80 * 1024 * 1024,
}
TASK_S = 0.02
LONG_S = 0.2  # the same mix once more, with tasks long enough that overheads matter less
SEED = 7


class Scale(NamedTuple):
    small: int  # 0.25/0.5/1-GPU tasks of the mixed workload
    large: int  # 2-GPU tasks
    stream: int  # small tasks behind the starvation probe's big one
    probe_s: float  # how long each of those runs
    overhead: int  # sequential no-op tasks
    rounds: int  # measured rounds, after one warm-up


FULL = Scale(small=200, large=10, stream=160, probe_s=0.05, overhead=30, rounds=3)
QUICK = Scale(small=12, large=2, stream=12, probe_s=0.02, overhead=3, rounds=1)


def work(seconds: float) -> tuple[float, float, str, tuple[str, ...]]:
    """A GPU task: its start, end, node and GPU ids (Ray's for plain tasks, hwpool's else)."""
    import ray  # noqa: PLC0415

    import hwpool  # noqa: PLC0415 - imported where the task runs

    start = time.time()
    time.sleep(seconds)
    leased = hwpool.current_gpus()
    gpus = tuple(map(str, leased)) if leased else tuple(map(str, ray.get_gpu_ids()))
    return start, time.time(), ray.get_runtime_context().get_node_id(), gpus


class Task(NamedTuple):
    share: float  # of one GPU; 2.0 means two whole GPUs
    seconds: float


class Ran(NamedTuple):
    task: Task
    submitted: float
    start: float
    end: float
    node: str
    gpus: tuple[str, ...]

    @property
    def wait(self) -> float:
        return self.start - self.submitted


Submit = Callable[[Task], Any]


def hwpool_submitter(pool: Any) -> Submit:
    def submit(task: Task) -> Any:
        if task.share > 1:
            return pool.submit(work, task.seconds, gpus=int(task.share))
        return pool.submit(work, task.seconds, fraction=task.share)

    return submit


def ray_submitter() -> Submit:
    import ray  # noqa: PLC0415

    remote = ray.remote(work)

    def submit(task: Task) -> Any:
        return remote.options(num_gpus=task.share, num_cpus=0, max_retries=0).remote(task.seconds)

    return submit


def run(submit: Submit, tasks: Sequence[Task]) -> tuple[float, list[Ran]]:
    """Submit every task at once; return the time of the first submission and what ran."""
    import ray  # noqa: PLC0415

    t0 = time.time()
    refs = []
    stamps = []
    for task in tasks:
        stamps.append(time.time())
        refs.append(submit(task))
    results = ray.get(refs, timeout=600)
    return t0, [Ran(t, s, *r) for t, s, r in zip(tasks, stamps, results, strict=True)]


def mixed_tasks(scale: Scale, seconds: float) -> list[Task]:
    rng = random.Random(SEED)
    tasks = [Task(rng.choice((0.25, 0.5, 1.0)), seconds) for _ in range(scale.small)]
    for _ in range(scale.large):
        tasks.insert(rng.randrange(len(tasks) + 1), Task(2.0, seconds))
    return tasks


def area(tasks: Sequence[Task]) -> float:
    return sum(t.share * t.seconds for t in tasks)


def peak_load(ran: Sequence[Ran]) -> float:
    """The most any one GPU held at one instant (shares of 2-GPU tasks count 1 per GPU)."""
    events: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in ran:
        share = min(r.task.share, 1.0)
        for gpu in r.gpus:
            events.setdefault((r.node, gpu), []).extend([(r.start, share), (r.end, -share)])
    peak = 0.0
    for steps in events.values():
        load = 0.0
        for _, delta in sorted(steps, key=lambda s: (s[0], s[1])):
            load += delta
            peak = max(peak, load)
    return peak


def mixed(submit: Submit, scale: Scale, seconds: float = TASK_S) -> dict[str, float]:
    tasks = mixed_tasks(scale, seconds)
    t0, ran = run(submit, tasks)
    makespan = max(r.end for r in ran) - t0
    large = [r.wait for r in ran if r.task.share > 1]
    bound = area(tasks) / GPUS
    return {
        "makespan": makespan,
        "bound": bound,
        "util": area(tasks) / (GPUS * makespan),
        "large_p50": statistics.median(large),
        "large_max": max(large),
        "peak": peak_load(ran),
    }


def starvation(submit: Submit, scale: Scale, warm_up: bool = False) -> dict[str, float]:
    """The probe (see the module); ``warm_up``: once unmeasured first, so that the worker
    processes it needs are started."""
    if warm_up:
        starvation(submit, scale)
    tasks = (
        [Task(0.25, scale.probe_s)] * 16
        + [Task(2.0, 0.0)]
        + [Task(0.25, scale.probe_s)] * scale.stream
    )
    _, ran = run(submit, tasks)
    big = ran[16]
    return {
        "big_wait": big.wait,
        "before_big": sum(r.start < big.start for r in ran[17:]),
        "stream": scale.stream,
        "peak": peak_load(ran),
    }


def overhead(submit: Submit, scale: Scale) -> float:
    import ray  # noqa: PLC0415

    ray.get(submit(Task(0.25, 0.0)), timeout=120)  # a warm worker
    start = time.perf_counter()
    for _ in range(scale.overhead):
        ray.get(submit(Task(0.25, 0.0)), timeout=120)
    return (time.perf_counter() - start) / scale.overhead


def compare(scale: Scale) -> dict[str, dict[str, Any]]:
    """Both contenders on the connected cluster: one warm-up round each (worker processes are
    started once, for whoever comes first), then ``scale.rounds`` rounds in alternating order;
    the best makespan and overhead of each, and the starvation probe once."""
    import hwpool.ray  # noqa: PLC0415

    # The tasks here never initialise CUDA, and plain Ray's ``.options(num_gpus=...)`` tasks
    # reuse workers across GPUs too (Ray's max_calls=1 applies only to a function decorated
    # with num_gpus): like for like. hwpool.ray's default pins a worker process to its
    # devices (docs/ray.md, "Worker processes").
    pool = hwpool.ray.connect(namespace="hwpool-bench", reuse_across_gpus=True)
    try:
        contenders = {"hwpool.ray": hwpool_submitter(pool), "Ray": ray_submitter()}
        for submit in contenders.values():
            mixed(submit, scale)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        costs: dict[str, list[float]] = {name: [] for name in contenders}
        for round_ in range(scale.rounds):
            names = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
            for name in names:
                runs[name].append(mixed(contenders[name], scale))
                costs[name].append(overhead(contenders[name], scale))
        out = {
            name: {
                "mixed": min(runs[name], key=lambda r: r["makespan"]),
                "overhead": min(costs[name]),
                "long": mixed(submit, scale, LONG_S),
                "starvation": starvation(submit, scale, warm_up=True),
            }
            for name, submit in contenders.items()
        }
        for name, figures in out.items():
            measured = [*runs[name], figures["long"], figures["starvation"]]
            figures["peak"] = max(m["peak"] for m in measured)
        return out
    finally:
        pool.close()


LISTENER = re.compile(r'users:\(\("(raylet|gcs_server|ray::[^"]*)",pid=(\d+)|pid=(\d+)')


def loopback_only() -> str:
    """Whether every socket the cluster's processes listen on is on 127.0.0.1."""
    if shutil.which("ss") is None:
        return "not checked (no ss)"
    lines = subprocess.run(
        ["ss", "-H", "-tulnp"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()
    ours = []
    for line in lines:
        match = LISTENER.search(line)
        if match is not None and (match.group(1) or match.group(3) == str(os.getpid())):
            ours.append(line.split()[4])
    wrong = [a for a in ours if not a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:"))]
    return f"{len(ours)} sockets, all on 127.0.0.1" if not wrong else f"NOT loopback: {wrong}"


@contextmanager
def local_cluster() -> Iterator[None]:
    """A 2 x 2 fake-GPU cluster on 127.0.0.1 with this process connected; always shut down."""
    import ray  # noqa: PLC0415
    from ray.cluster_utils import Cluster  # noqa: PLC0415

    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False}
    )
    try:
        for _ in range(NODES - 1):
            cluster.add_node(**NODE_ARGS)
        ray.init(address=cluster.address, log_to_driver=False)
        yield
    finally:
        ray.shutdown()
        cluster.shutdown()


def table(out: dict[str, dict[str, Any]], scale: Scale, sockets: str) -> str:
    h, r = out["hwpool.ray"], out["Ray"]
    hm, rm, hs, rs = h["mixed"], r["mixed"], h["starvation"], r["starvation"]
    hl, rl = h["long"], r["long"]
    rows = [
        ("mixed: makespan (s)", f"{hm['makespan']:.2f}", f"{rm['makespan']:.2f}"),
        ("mixed: lower bound (s)", f"{hm['bound']:.2f}", f"{rm['bound']:.2f}"),
        ("mixed: GPU utilisation", f"{hm['util']:.0%}", f"{rm['util']:.0%}"),
        ("mixed: 2-GPU tasks' wait p50 (s)", f"{hm['large_p50']:.2f}", f"{rm['large_p50']:.2f}"),
        ("mixed: 2-GPU tasks' wait max (s)", f"{hm['large_max']:.2f}", f"{rm['large_max']:.2f}"),
        ("mixed: most load on one GPU", f"{h['peak']:.2f}", f"{r['peak']:.2f}"),
        ("200 ms mix: makespan (s)", f"{hl['makespan']:.2f}", f"{rl['makespan']:.2f}"),
        ("200 ms mix: lower bound (s)", f"{hl['bound']:.2f}", f"{rl['bound']:.2f}"),
        ("200 ms mix: GPU utilisation", f"{hl['util']:.0%}", f"{rl['util']:.0%}"),
        ("200 ms mix: 2-GPU wait p50 (s)", f"{hl['large_p50']:.2f}", f"{rl['large_p50']:.2f}"),
        ("200 ms mix: 2-GPU wait max (s)", f"{hl['large_max']:.2f}", f"{rl['large_max']:.2f}"),
        ("probe: whole-node task's wait (s)", f"{hs['big_wait']:.2f}", f"{rs['big_wait']:.2f}"),
        (
            f"probe: of {scale.stream} later tasks, started first",
            f"{hs['before_big']}",
            f"{rs['before_big']}",
        ),
        ("per-task overhead (ms)", f"{h['overhead'] * 1e3:.1f}", f"{r['overhead'] * 1e3:.1f}"),
    ]
    lines = [
        f"hwpool.ray vs plain Ray on {NODES} nodes x {GPUS_PER_NODE} fake GPUs (Python "
        f"{sys.version.split()[0]}; {scale.small} + {scale.large} mixed tasks of "
        f"{TASK_S * 1e3:.0f} ms; best of {scale.rounds} rounds; Ray sockets: {sockets})",
        f"{'measure':<42}{'hwpool.ray':>12}{'plain Ray':>12}",
        *(f"{name:<42}{a:>12}{b:>12}" for name, a, b in rows),
        f"{'overhead ratio (hwpool.ray / Ray)':<42}{h['overhead'] / r['overhead']:>12.2f}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    """Start the cluster, measure both, return the table (printed when run as a script)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small workload (smoke test)")
    args = parser.parse_args(argv)
    try:
        import ray  # noqa: PLC0415
    except ModuleNotFoundError:
        return "bench_ray: skipped (needs Ray: pip install 'hwpool[ray]')"
    if __name__ != "__main__" and __name__ in sys.modules:  # imported: ship its tasks whole
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    scale = QUICK if args.quick else FULL
    with local_cluster():
        out = compare(scale)
        sockets = loopback_only()
    return table(out, scale, sockets)


if __name__ == "__main__":
    print(main())
