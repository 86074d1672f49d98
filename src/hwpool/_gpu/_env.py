"""What a child process needs to run on a lease's GPUs: the device ids and its environment.

CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises, so a child started inside a
lease must get it in its environment; without it the child sees every GPU and CUDA picks GPU 0.
Each GPU of a pool is named by the most stable id detection found: its UUID (``GPU-...``,
``MIG-...``) when nvidia-smi reported one, else the entry of the inherited
``CUDA_VISIBLE_DEVICES`` it came from, else its index. ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes
CUDA number devices as nvidia-smi does, so that an index means the same device to both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

from .._backends._unix import SOCKET_VAR, UnixBackend
from .._host._detect import VISIBLE_VAR, GPUInfo
from .._host._devices import device_id

__all__ = ["DEVICE_ORDER_VAR", "LEASE_VAR", "device_id", "lease_environment"]

DEVICE_ORDER_VAR = "CUDA_DEVICE_ORDER"
LEASE_VAR = "HWPOOL_LEASE"


def lease_devices(pool_gpus: Sequence[GPUInfo], gpus: Iterable[int]) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the pool GPUs ``gpus``, in their order."""
    return [device_id(pool_gpus[gpu]) for gpu in gpus]


def lease_environment(
    devices: Sequence[str],
    description: Mapping[str, object],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` (default: ``os.environ``) with the lease's GPU variables set.

    ``HWPOOL_SOCKET`` is removed: a ``GPUPool()`` in the child then shares out the lease's
    own GPUs (those it sees) instead of queueing again for the whole host.
    """
    env = dict(os.environ if base is None else base)
    env[VISIBLE_VAR] = ",".join(devices)
    env[DEVICE_ORDER_VAR] = "PCI_BUS_ID"
    env[LEASE_VAR] = json.dumps(dict(description), separators=(",", ":"))
    env.pop(SOCKET_VAR, None)
    return env


def describe_lease(
    backend: object,
    ticket: int,
    gpus: Sequence[int],
    fraction: float,
    devices: Sequence[str],
    *,
    memory_mib: int | None = None,
) -> dict[str, object]:
    """What ``HWPOOL_LEASE`` says: the pool's GPU indices, the share of each, the device ids,
    on a pool sized in memory the MiB held in all (``memory_mib``), and for a lease of the
    host server its id there (as ``hwpool status`` shows it) and socket."""
    out: dict[str, object] = {"gpus": list(gpus), "fraction": fraction, "devices": list(devices)}
    if memory_mib is not None:
        out["memory_mib"] = memory_mib
    if isinstance(backend, UnixBackend):
        lease_id = backend.lease_id(ticket)
        if lease_id is not None:
            out["id"] = lease_id
        out["socket"] = str(backend.socket)
    return out
