"""memory= on hwpool.ray, on a real local cluster whose two nodes have GPUs of different sizes.

The sizes come from the node resource ``hwpool_gpu_mib`` (logical GPUs have no memory that
nvidia-smi could read). A cluster of its own, in a subprocess (the session's GPUs have no sizes).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from raydriver import run_driver

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]


DRIVER = textwrap.dedent(
    """
    import json, ray, hwpool, hwpool.ray
    from ray.cluster_utils import Cluster

    args = dict(node_ip_address="127.0.0.1", num_cpus=1, object_store_memory=80 * 1024 * 1024)
    cluster = Cluster(initialize_head=True, head_node_args={
        **args, "num_gpus": 1, "resources": {"hwpool_gpu_mib": 16384}, "include_dashboard": False})
    cluster.add_node(**args, num_gpus=1, resources={"hwpool_gpu_mib": 81920})
    ray.init(address=cluster.address, log_to_driver=False)
    out = {}
    try:
        pool = hwpool.ray.connect()
        size = {n.node_id: n.gpus[0].memory_mib for n in pool.snapshot().nodes}
        while len(size) < 2:
            size = {n.node_id: n.gpus[0].memory_mib for n in pool.snapshot().nodes}

        def where():
            return ray.get_runtime_context().get_node_id(), hwpool.current_gpus()

        out["20000"] = size[ray.get(pool.submit(where, memory=20000), timeout=120)[0]]
        out["16GiB"] = size[ray.get(pool.submit(where, memory="16GiB"), timeout=120)[0]]
        for bad in ({"memory": 100000}, {"memory": "lots"}, {"memory": 0},
                    {"memory": 1024, "fraction": 0.5}):
            try:
                pool.submit(where, **bad)
            except (TypeError, ValueError) as exc:
                out.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}")
        snap = pool.snapshot()
        out["queued"] = len(snap.waiting)
        pool.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(out))
    """
)


def test_memory_lands_on_a_gpu_large_enough_and_bad_amounts_are_refused_naming_them() -> None:
    last = run_driver(DRIVER, timeout=170)
    out = json.loads(last)
    assert out["20000"] == 81920  # fits only the large GPU
    assert out["16GiB"] == 16384  # best fit: fills the small GPU exactly
    errors = out["errors"]
    assert "memory=100000MiB is more than any GPU" in errors[0] and "81920 MiB" in errors[0]
    assert errors[1].startswith("ValueError: ") and "'lots'" in errors[1]
    assert "memory" in errors[2] and "0" in errors[2]
    assert "fraction=0.5" in errors[3] and "memory=1024" in errors[3]
    assert out["queued"] == 0
