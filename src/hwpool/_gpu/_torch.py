"""``hwpool.torch_limit()``: cap PyTorch's allocator at the leased share of each GPU.

PyTorch reads no environment variable for this; ``torch.cuda.set_per_process_memory_fraction``
caps its caching allocator at a share of a device's total memory, in the process that calls
it. So the job calls this once, before it allocates. torch is imported only by the call.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._env import LEASE_VAR

if TYPE_CHECKING:
    from ._lease import GPULease

__all__ = ["torch_limit"]


def torch_limit(lease: GPULease | None = None) -> dict[int, float]:
    """Cap PyTorch's CUDA allocator on each leased GPU at the lease's share of its memory;
    returns what was set: torch's device index -> fraction (``{}`` for whole GPUs: no cap).

    Without ``lease``, the lease this process was started in (``HWPOOL_LEASE``, set by
    ``lease.env()``, ``hwpool run``, ``hwpool submit``): its GPUs are devices ``0..n-1``, in
    lease order, as ``CUDA_VISIBLE_DEVICES`` lists them. With a held ``lease`` of this process,
    its ``.gpus`` are the device indices (what torch numbers them where this process sees the
    pool's GPUs in the pool's order: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).

    RuntimeError when there is no lease (``HWPOOL_LEASE`` unset, or ``lease`` holds no GPU);
    ValueError naming ``HWPOOL_LEASE`` when it is malformed; ImportError when torch is not
    installed. Nothing is set then.
    """
    shares = _leased_shares(lease) if lease is not None else _inherited_shares(os.environ)
    torch = _import_torch()
    for device, share in shares.items():
        torch.cuda.set_per_process_memory_fraction(share, device)
    return shares


def _leased_shares(lease: GPULease) -> dict[int, float]:
    """Device index -> share of a lease held by this process."""
    grant = lease._grant
    if grant is None:
        raise RuntimeError(
            "torch_limit(lease): this GPULease holds no GPU (enter it first): nothing to limit"
        )
    share = lease._memory_share(grant)
    return {} if share is None else dict.fromkeys(grant.gpus, share)


def _inherited_shares(environ: Mapping[str, str]) -> dict[int, float]:
    """Device index -> share of the lease this process was started in."""
    text = environ.get(LEASE_VAR)
    if text is None:
        raise RuntimeError(
            f"torch_limit(): this process holds no lease ({LEASE_VAR} is not set): start it "
            "with lease.run(), lease.popen(), hwpool run or hwpool submit, or pass lease="
        )
    about = _parse_lease(text)
    devices, share = about.get("devices"), about.get("memory_share")
    if not isinstance(devices, list) or not (share is None or _is_share(share)):
        raise ValueError(
            f"{LEASE_VAR} must list 'devices' and a 'memory_share' in (0, 1], got {text!r}"
        )
    return {} if share is None else dict.fromkeys(range(len(devices)), float(share))


def _parse_lease(text: str) -> dict[str, Any]:
    """``HWPOOL_LEASE``'s JSON object; ValueError naming it otherwise."""
    try:
        about = json.loads(text)
    except ValueError:
        about = None
    if not isinstance(about, dict):
        raise ValueError(f"{LEASE_VAR} must be a JSON object, got {text!r}")
    return about


def _is_share(value: object) -> bool:
    """Whether ``value`` is a number in (0, 1] (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


def _import_torch() -> Any:
    """The ``torch`` module; ImportError saying what is missing."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise ImportError(
            f"torch_limit() needs PyTorch, which does not import here ({exc}): "
            "pip install torch, or cap the allocator yourself"
        ) from exc
