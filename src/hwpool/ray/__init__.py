"""hwpool over a Ray cluster: one fair GPU queue for every GPU of every node.

``pool = hwpool.ray.connect()`` (after ``ray.init``) joins the cluster's scheduler actor;
``pool.submit(fn, *args, fraction=0.25)`` and ``@pool.remote(gpus=2)`` functions return an
``ObjectRef`` at once and run on the node holding their GPUs, which they alone see;
``pool.start_actor(cls, fraction=0.5)`` starts an actor that holds its share for its lifetime.
Importing :mod:`hwpool` never imports Ray; importing this package needs it
(``pip install 'hwpool[ray]'``).
"""

try:
    import ray as _ray

    _ray.remote  # noqa: B018 - a folder named ray on sys.path is not Ray
except (ImportError, AttributeError) as exc:
    raise ImportError("hwpool.ray needs Ray: pip install 'hwpool[ray]'") from exc

from ._pool import LeasedFunction, RayGPUPool, connect
from ._state import ClusterSnapshot, LeaseSnapshot, NodeGPU, NodeSnapshot, WaitingSnapshot

__all__ = [
    "ClusterSnapshot",
    "LeaseSnapshot",
    "LeasedFunction",
    "NodeGPU",
    "NodeSnapshot",
    "RayGPUPool",
    "WaitingSnapshot",
    "connect",
]


def _publish() -> None:
    """Give the public names ``__module__ = "hwpool.ray"`` (as ``hwpool`` does for its own)."""
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or callable(obj):
            obj.__module__ = __name__


_publish()
