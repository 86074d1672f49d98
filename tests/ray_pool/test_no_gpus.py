"""hwpool.ray on a Ray cluster without GPUs: the error says what was asked and what to do.

The README's example run as is on a machine without GPUs starts a cluster with none; its first
``fraction=0.25`` must fail with a message naming that fraction and the way out (logical GPUs:
``ray.init(num_gpus=N)``), not a complaint about a request the user never made.
"""

from __future__ import annotations

import textwrap

import pytest

from raydriver import run_driver

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


# A cluster of its own (address="local": never the session's), one node, no GPUs, on loopback.
DRIVER = textwrap.dedent(
    """
    import ray, hwpool.ray
    ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    pool = hwpool.ray.connect()
    try:
        pool.submit(print, fraction=0.25)
    except ValueError as exc:
        print(exc)
    else:
        print("queued")
    pool.close()
    ray.shutdown()
    """
)


def test_a_fraction_on_a_cluster_without_gpus_fails_naming_it_and_the_way_out() -> None:
    message = run_driver(DRIVER, timeout=100)
    assert "fraction=0.25" in message, message
    assert "gpus=1" not in message, message
    assert "ray.init(num_gpus=" in message, message
