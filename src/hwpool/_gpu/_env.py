"""What a child process needs to run on a lease's GPUs: the device ids and its environment.

CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it initialises, so a child started inside a
lease must get it in its environment; without it the child sees every GPU and CUDA picks GPU 0.
Each GPU of a pool is named by the most stable id detection found: its UUID (``GPU-...``,
``MIG-...``) wherever NVML or nvidia-smi reported one (inherited ``CUDA_VISIBLE_DEVICES``
entries are matched to them, see ``_host._visible``), else the inherited entry, else its
index. ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number devices as nvidia-smi does, so that
an index means the same device to both.

A lease of part of a GPU also sets the knobs a framework reads to stay inside a share of the
device's memory (JAX's, see :func:`framework_knobs`), unless the base environment sets them
already: the user's choice wins.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence

from .._backends._unix import SOCKET_VAR, UnixBackend
from .._host._detect import GPUInfo
from .._host._devices import device_id
from .._host._visible import VISIBLE_VAR

__all__ = [
    "DEVICE_ORDER_VAR", "JAX_FRACTION_VARS", "JAX_PREALLOCATE_VAR", "LEASE_VAR", "device_id",
    "framework_knobs", "lease_environment", "memory_share",
]  # fmt: skip

DEVICE_ORDER_VAR = "CUDA_DEVICE_ORDER"
LEASE_VAR = "HWPOOL_LEASE"
JAX_FRACTION_VARS = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
"""JAX's cap on its allocator, as a share of the device's total memory: the name JAX has
long read, and the newer name that replaces it (both set, to the same value)."""
JAX_PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"


def lease_devices(pool_gpus: Sequence[GPUInfo], gpus: Iterable[int]) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries of the pool GPUs ``gpus``, in their order."""
    return [device_id(pool_gpus[gpu]) for gpu in gpus]


def lease_environment(
    devices: Sequence[str],
    description: Mapping[str, object],
    base: Mapping[str, str] | None = None,
    share: float | None = None,
) -> dict[str, str]:
    """``base`` (default: ``os.environ``) with the lease's GPU variables set, and for a lease
    of ``share`` of each GPU's memory (None: whole GPUs) the framework knobs that ``base``
    does not set already (:func:`framework_knobs`).

    ``HWPOOL_SOCKET`` is removed: a ``GPUPool()`` in the child then shares out the lease's
    own GPUs (those it sees) instead of queueing again for the whole host.
    """
    env = dict(os.environ if base is None else base)
    env[VISIBLE_VAR] = ",".join(devices)
    env[DEVICE_ORDER_VAR] = "PCI_BUS_ID"
    env[LEASE_VAR] = json.dumps(dict(description), separators=(",", ":"))
    env.pop(SOCKET_VAR, None)
    for name, value in framework_knobs(share, env).items():
        env[name] = value
    return env


def framework_knobs(share: float | None, env: Mapping[str, str]) -> dict[str, str]:
    """The JAX variables that keep a process inside ``share`` of each GPU's memory, less those
    ``env`` sets already (the user's choice wins; the two fraction names count as one).

    ``XLA_PYTHON_CLIENT_PREALLOCATE=false``: JAX allocates as it needs instead of taking 75%
    of the device at its first operation; the memory fraction caps its allocator at the share
    (rounded down to 1/10000; left out if that is 0). None (whole GPUs, or a share not known):
    nothing, JAX's defaults stand.
    """
    if share is None:
        return {}
    knobs: dict[str, str] = {}
    if JAX_PREALLOCATE_VAR not in env:
        knobs[JAX_PREALLOCATE_VAR] = "false"
    capped = math.floor(min(share, 1.0) * 10_000) / 10_000
    if capped > 0 and not any(name in env for name in JAX_FRACTION_VARS):
        knobs.update(dict.fromkeys(JAX_FRACTION_VARS, f"{capped:g}"))
    return knobs


def memory_share(
    pool_gpus: Sequence[GPUInfo],
    gpus: Sequence[int],
    *,
    fraction: float | None,
    mib_each: int | None,
    pool_totals: Sequence[int] | None,
) -> float | None:
    """The share of each leased GPU's memory a lease of part of a GPU holds: ``fraction`` for
    a fraction, else ``mib_each`` over the GPU's total (the detected total, else the pool's
    size of it), the least over ``gpus``; None when neither is given or a total is unknown."""
    if fraction is not None:
        return fraction
    if mib_each is None or not gpus:
        return None
    shares: list[float] = []
    for gpu in gpus:
        total = pool_gpus[gpu].memory_mib if gpu < len(pool_gpus) else None
        if total is None and pool_totals is not None:
            total = pool_totals[gpu]
        if not total:
            return None
        shares.append(mib_each / total)
    return min(shares)


def describe_lease(
    backend: object,
    ticket: int,
    gpus: Sequence[int],
    fraction: float,
    devices: Sequence[str],
    *,
    memory_mib: int | None = None,
    share: float | None = None,
) -> dict[str, object]:
    """What ``HWPOOL_LEASE`` says: the pool's GPU indices, the share of each, the device ids,
    on a pool sized in memory the MiB held in all (``memory_mib``), for a lease of part of a
    GPU the share of each GPU's total memory it may use (``memory_share``, where known), and
    for a lease of the host server its id there (as ``hwpool status`` shows it) and socket."""
    out: dict[str, object] = {"gpus": list(gpus), "fraction": fraction, "devices": list(devices)}
    if memory_mib is not None:
        out["memory_mib"] = memory_mib
    if share is not None:
        out["memory_share"] = share
    if isinstance(backend, UnixBackend):
        lease_id = backend.lease_id(ticket)
        if lease_id is not None:
            out["id"] = lease_id
        out["socket"] = str(backend.socket)
    return out
