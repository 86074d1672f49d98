"""One local Ray cluster for every Ray test: 2 nodes x 2 fake GPUs, on 127.0.0.1 only.

Started once per session (about 5 s on the 2-core VM) and always shut down, also on failure.
Each test gets its own namespace, hence its own scheduler actor, so tests do not share a queue.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# Ray resolves a loopback address to the machine's outward address unless this is 0; here every
# Ray process must bind and talk on 127.0.0.1 only. Read when Ray is imported, and inherited by
# every process the cluster starts.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

LOOPBACK = "127.0.0.1"
NODE_ARGS: dict[str, Any] = {
    "node_ip_address": LOOPBACK,
    "num_cpus": 1,
    "num_gpus": 2,
    "object_store_memory": 80 * 1024 * 1024,
}


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    """The session's cluster, with the driver connected to it (skipped without Ray)."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster  # noqa: PLC0415 - only where Ray is installed

    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False}
    )
    try:
        cluster.add_node(**NODE_ARGS)
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
