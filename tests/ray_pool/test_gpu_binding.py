"""A worker process keeps the GPUs it started with (issue 36).

CUDA reads ``CUDA_VISIBLE_DEVICES`` once per process, when it initialises (CUDA Programming
Guide, "CUDA Environment Variables"), so a Ray worker that ran a lease of one GPU and then
one of another computes the second on the first GPU. Ray gives its own GPU tasks
``max_calls=1`` for this reason (``ray.remote``: "By default infinite for CPU tasks and 1 for
GPU tasks"). hwpool.ray reuses a worker process only for leases on exactly the same devices,
unless ``reuse_across_gpus=True`` (work that never initialises CUDA).

On the session's real local cluster (2 nodes x 2 fake GPUs): an actor holds both GPUs of one
node, so that on the other node leases of one GPU and of both GPUs alternate, and every task
records its process and ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from test_cluster import pool as cluster_pool  # noqa: E402

import hwpool.ray  # noqa: E402
from hwpool.ray import RayGPUPool, _worker  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

pool = cluster_pool  # the fixture: a namespace (so a scheduler) of its own, default options

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

DEMANDS: list[dict[str, Any]] = [{"gpus": 2}, {"fraction": 1.0}] * 4
"""Sequential leases whose device sets differ from one task to the next (on one node)."""


class Holder:
    """Holds its lease (both GPUs of a node) while it lives."""

    def node(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


@pytest.fixture
def one_node(pool: RayGPUPool) -> Iterator[str]:
    """Both GPUs of one node held by an actor: the tests' leases go to the other node; the
    held node's id."""
    holder = ray.get(pool.start_actor(Holder, gpus=2), timeout=120)
    try:
        yield ray.get(holder.node.remote(), timeout=60)
    finally:
        ray.kill(holder)


def where() -> tuple[int, str, str | None]:
    """This process, its node and the devices it was leased."""
    node = ray.get_runtime_context().get_node_id()
    return os.getpid(), node, os.environ.get("CUDA_VISIBLE_DEVICES")


def device_sets(runs: list[tuple[int, str, str | None]]) -> dict[int, set[str | None]]:
    """Per worker process, every ``CUDA_VISIBLE_DEVICES`` its tasks saw."""
    seen: dict[int, set[str | None]] = {}
    for pid, _, visible in runs:
        seen.setdefault(pid, set()).add(visible)
    return seen


@pytest.fixture
def fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This test process as a worker that has run no lease yet."""
    monkeypatch.setattr(_worker, "_first_devices", None)
    yield


def test_a_pinned_lease_on_other_devices_never_runs_in_the_process(
    fresh_process_state: None,
) -> None:
    """The worker-side check, in this process: the first pinned lease's devices stay its
    own; a lease on the same devices runs, one on others raises before the function runs,
    naming both; an unpinned lease (``reuse_across_gpus``) is not checked."""
    calls: list[str | None] = []

    def record() -> None:
        calls.append(os.environ.get("CUDA_VISIBLE_DEVICES"))

    _worker.run_leased(record, (0,), ("GPU-aaaa",), True)
    _worker.run_leased(record, (0,), ("GPU-aaaa",), True)
    with pytest.raises(RuntimeError, match=r"GPU-aaaa.*GPU-bbbb.*reuse_across_gpus"):
        _worker.run_leased(record, (1,), ("GPU-bbbb",), True)
    _worker.run_leased(record, (1,), ("GPU-bbbb",), False)
    assert calls == ["GPU-aaaa", "GPU-aaaa", "GPU-bbbb"]


def test_by_default_no_worker_process_sees_two_device_sets(pool: RayGPUPool, one_node: str) -> None:
    """Reused workers (the default) run leases on one set of devices each: no pid ever saw
    two values of ``CUDA_VISIBLE_DEVICES``, and each task saw exactly its lease's."""
    runs = [ray.get(pool.submit(where, **demand), timeout=120) for demand in DEMANDS]
    assert one_node not in {node for _, node, _ in runs}
    mixed = {pid: sets for pid, sets in device_sets(runs).items() if len(sets) > 1}
    assert not mixed, f"worker processes ran leases on different GPUs: {mixed}"
    assert [len((v or "").split(",")) for _, _, v in runs] == [2, 1] * 4


def test_reuse_across_gpus_lets_one_worker_serve_several_device_sets(
    pool: RayGPUPool, one_node: str
) -> None:
    """The opt-in: with ``reuse_across_gpus=True`` a worker process runs leases on other
    devices than its first (each task still sees its own lease's devices)."""
    shared = hwpool.ray.connect(namespace=pool.namespace, reuse_across_gpus=True)
    try:
        runs: list[tuple[int, str, str | None]] = []
        for demand in DEMANDS * 2:
            runs.append(ray.get(shared.submit(where, **demand), timeout=120))
            if any(len(sets) > 1 for sets in device_sets(runs).values()):
                break
        assert any(len(sets) > 1 for sets in device_sets(runs).values()), runs
    finally:
        shared.close()


def test_reuse_across_gpus_needs_reused_workers(pool: RayGPUPool) -> None:
    with pytest.raises(ValueError, match=r"reuse_across_gpus=True .* reuse_workers=False"):
        hwpool.ray.connect(reuse_workers=False, reuse_across_gpus=True)
    with pytest.raises(TypeError, match="reuse_across_gpus"):
        hwpool.ray.connect(reuse_across_gpus="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reuse_across_gpus"):
        pool.remote(reuse_worker=False, reuse_across_gpus=True)
