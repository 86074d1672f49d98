"""Promises of docs/ray.md that had no test (issue 25), on the real local cluster.

Worker reuse, ``pool.close()`` ending running work, a leased actor that crashes or exits by
itself, two drivers sharing one queue, and a node with ``nvidia-smi`` (a fake one, first on
the PATH of a node added for the test) whose GPUs are leased by UUID and whose death before a
granted task starts there makes the task ask again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from conftest import NODE_ARGS
from fakes.gpus import A100, RTX, smi_script

ray = pytest.importorskip("ray")

from test_cluster import (  # noqa: E402
    assert_never_over_granted,
    eventually,
    free_everywhere,
    record,
    signal_actor,
)
from test_cluster import pool as cluster_pool  # noqa: E402

import hwpool  # noqa: E402
import hwpool.ray  # noqa: E402
from hwpool import UNITS_PER_GPU  # noqa: E402
from hwpool.ray import RayGPUPool  # noqa: E402
from hwpool.ray._actor import SCHEDULER_NAME, SchedulerActor  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

pool = cluster_pool  # the fixture: a namespace (so a scheduler) of its own, reusing workers

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Gate:
    """Tasks report their process here, then wait until the gate opens (a Ray actor)."""

    def __init__(self) -> None:
        self.opened = False
        self.pids: dict[str, int] = {}

    def arrive(self, name: str, pid: int) -> None:
        self.pids[name] = pid

    def open(self) -> None:
        self.opened = True

    def is_open(self) -> bool:
        return self.opened

    def arrived(self) -> dict[str, int]:
        return dict(self.pids)


def wait_at(gate: Any, name: str) -> int:
    """Report this process to ``gate``, wait until it opens; return the pid."""
    ray.get(gate.arrive.remote(name, os.getpid()))
    while not ray.get(gate.is_open.remote()):
        ray.get(gate.arrive.remote(name, os.getpid()))  # a round trip instead of a sleep
    return os.getpid()


def seen() -> dict[str, Any]:
    """The process, node, GPUs and device variables a leased task runs with."""
    return {
        "pid": os.getpid(),
        "node": ray.get_runtime_context().get_node_id(),
        "gpus": tuple(hwpool.current_gpus()),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "order": os.environ.get("CUDA_DEVICE_ORDER"),
    }


def pid_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ----------------------------------------------------------------- reuse_workers
def test_reuse_workers_runs_later_tasks_in_the_same_worker_process(pool: RayGPUPool) -> None:
    """``reuse_workers=True`` (the fixture's pool): one after another, the tasks of one shape
    on one node run in a worker process that ran one before, each seeing exactly its own GPU
    (the lease's variables are set per task and restored after)."""
    devices = {(n.node_id, g.index): g.device_id for n in pool.snapshot().nodes for g in n.gpus}
    runs = [ray.get(pool.submit(seen, fraction=1.0), timeout=60) for _ in range(6)]
    pids = [run["pid"] for run in runs]
    assert len(set(pids)) < len(pids), f"every task had a fresh worker: {pids}"
    for run in runs:
        assert run["visible"] == ",".join(devices[run["node"], g] for g in run["gpus"])


# ----------------------------------------------------------------- pool.close()
def test_close_ends_that_pools_running_work_and_frees_its_gpus(pool: RayGPUPool) -> None:
    gate = ray.remote(num_cpus=0)(Gate).remote()
    other = hwpool.ray.connect(namespace=pool.namespace, reuse_workers=True)
    try:
        doomed = other.submit(wait_at, gate, "doomed", gpus=2)
        mine = pool.submit(wait_at, gate, "mine", fraction=0.5)
        eventually(lambda: set(ray.get(gate.arrived.remote())) == {"doomed", "mine"}, 90)
        doomed_pid = ray.get(gate.arrived.remote())["doomed"]
        assert len(pool.snapshot().leases) == 2
    finally:
        other.close()
    eventually(lambda: pid_is_gone(doomed_pid))  # its process was ended, not left running
    with pytest.raises(ray.exceptions.RayError):
        ray.get(doomed, timeout=60)
    eventually(lambda: [x.fraction for x in pool.snapshot().leases] == [0.5])
    ray.get(gate.open.remote())
    assert ray.get(mine, timeout=60) > 0  # the other pool's work ran on
    eventually(lambda: free_everywhere(pool))


# ----------------------------------------------------------------- leased actors
class Fragile:
    def gpus(self) -> tuple[int, ...]:
        return tuple(hwpool.current_gpus())

    def crash(self) -> None:
        os._exit(1)

    def leave(self) -> None:
        ray.actor.exit_actor()


class FragileAsync:
    async def gpus(self) -> tuple[int, ...]:
        return tuple(hwpool.current_gpus())

    async def leave(self) -> None:
        ray.actor.exit_actor()


@pytest.mark.parametrize(
    ("cls", "ending"), [(Fragile, "crash"), (Fragile, "leave"), (FragileAsync, "leave")]
)
def test_a_leased_actor_that_crashes_or_exits_by_itself_gives_its_lease_back(
    pool: RayGPUPool, cls: type, ending: str
) -> None:
    """A crash ends the actor's watch call; ``exit_actor()`` let it run on, keeping the actor
    and its lease for ever (issue 25: the lease was still held 30 s later), until the
    wrapped methods ended the watch on the way out."""
    handle = ray.get(pool.start_actor(cls, fraction=0.5), timeout=60)
    (lease,) = pool.snapshot().leases
    assert ray.get(handle.gpus.remote(), timeout=60) == lease.gpus
    with suppress(ray.exceptions.RayActorError):
        ray.get(getattr(handle, ending).remote(), timeout=60)
    eventually(lambda: free_everywhere(pool))


# ----------------------------------------------------------------- several drivers
def test_two_drivers_share_one_queue_and_are_never_over_granted(
    cluster: Any, pool: RayGPUPool
) -> None:
    """Another driver process queues behind this one's work in the same namespace: one queue,
    in the order the requests came, no GPU over-granted between the two."""
    gate = signal_actor()
    holders = [pool.submit(record, UNITS_PER_GPU, 0, gate, gpus=2) for _ in range(2)]
    eventually(lambda: len(pool.snapshot().leases) == 2)  # every GPU held
    other = textwrap.dedent(
        f"""
        import json, os, time, ray, hwpool, hwpool.ray
        ray.init(address={cluster.address!r}, log_to_driver=False)
        pool = hwpool.ray.connect(namespace={pool.namespace!r}, reuse_workers=True)

        def record(units):
            start = time.time()
            time.sleep(0.05)
            node = ray.get_runtime_context().get_node_id()
            gpus = tuple(hwpool.current_gpus())
            return {{"start": start, "end": time.time(), "node": node, "gpus": gpus,
                    "units": units}}

        full = {UNITS_PER_GPU}
        refs = [pool.submit(record, full, gpus=2), pool.submit(record, full // 2, fraction=0.5),
                pool.submit(record, full // 2, fraction=0.5)]
        print(json.dumps(ray.get(refs, timeout=120)))
        """
    )
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    driver = subprocess.Popen(
        [sys.executable, "-c", other], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        eventually(lambda: len(pool.snapshot().waiting) == 3, 90)
        mine = [pool.submit(record, UNITS_PER_GPU, 0.05, fraction=1.0) for _ in range(2)]
        eventually(lambda: len(pool.snapshot().waiting) == 5)
        waiting = pool.snapshot().waiting
        clients = [w.client for w in waiting]
        assert len(set(clients)) == 2 and clients[:3] == [clients[0]] * 3  # theirs came first
        assert [(w.count, w.fraction) for w in waiting] == [(2, 1.0), (1, 0.5), (1, 0.5)] + [
            (1, 1.0)
        ] * 2
        ray.get(gate.send.remote())
        out, _ = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 0
    theirs = [{**r, "gpus": tuple(r["gpus"])} for r in json.loads(out.strip().splitlines()[-1])]
    records = ray.get([*holders, *mine], timeout=60) + theirs
    assert_never_over_granted(records)
    eventually(lambda: free_everywhere(pool))


# ----------------------------------------------------------------- a node with nvidia-smi
@pytest.fixture
def quiet_scheduler(cluster: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A scheduler of a namespace of its own that reads the nodes only when asked (no
    polling), so that the test decides when it learns of a node's death; and its pool."""
    namespace = "t-quiet-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    scheduler = (
        ray.remote(SchedulerActor)
        .options(name=SCHEDULER_NAME, namespace=namespace, lifetime="detached", num_cpus=0)
        .remote(namespace, 3600.0)
    )
    pool = hwpool.ray.connect(namespace=namespace, reuse_workers=True)
    try:
        yield scheduler, pool
    finally:
        pool.close()
        ray.kill(scheduler)


def test_a_node_with_nvidia_smi_leases_by_uuid_and_a_task_whose_node_died_asks_again(
    cluster: Any, quiet_scheduler: tuple[Any, RayGPUPool], tmp_path: Path
) -> None:
    scheduler, pool = quiet_scheduler
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + smi_script([A100, RTX]))
    smi.chmod(0o755)
    path = f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"
    node = cluster.add_node(**NODE_ARGS, env_vars={"PATH": path})
    try:
        cluster.wait_for_nodes()
        snap = ray.get(scheduler.sync_nodes.remote(), timeout=90)
        (found,) = [n for n in snap.nodes if n.node_id == node.node_id]
        assert [(g.device_id, g.uuid, g.memory_mib) for g in found.gpus] == [
            (A100.uuid, A100.uuid, A100.memory_mib),
            (RTX.uuid, RTX.uuid, RTX.memory_mib),
        ]
        gate = signal_actor()
        holders = [pool.submit(record, UNITS_PER_GPU, 0, gate, gpus=2) for _ in range(2)]
        eventually(lambda: len(pool.snapshot().leases) == 2)  # the first two nodes
        there = ray.get(pool.submit(seen, gpus=2), timeout=90)  # the new node is all left
        assert there["node"] == node.node_id
        assert there["visible"] == f"{A100.uuid},{RTX.uuid}" and there["order"] is None
        # The node dies; this scheduler does not poll, so it still grants the node's GPUs:
        # the task cannot start there, gives them back as lost with the node, and asks again.
        cluster.remove_node(node)
        cluster.wait_for_nodes()  # Ray knows it is dead
        again = pool.submit(seen, gpus=2)
        eventually(lambda: node.node_id not in {n.node_id for n in pool.snapshot().nodes})
        eventually(lambda: len(pool.snapshot().waiting) == 1)
        ray.get(gate.send.remote())
        moved = ray.get(again, timeout=90)
        assert moved["node"] != node.node_id and moved["gpus"] == (0, 1)
        ray.get(holders, timeout=60)
        eventually(lambda: free_everywhere(pool))
    finally:
        with suppress(Exception):
            cluster.remove_node(node)
