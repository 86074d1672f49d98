"""The seam between the GPUPool front and what owns the scheduler core.

The front (``hwpool.GPUPool``: validation, ``GPULease``, ``current_gpus``, the ``acquire*``
methods) exists once; a backend only grants and takes back. The in-process backend is a lock,
the core and its parked waiters; the host-server client and the Ray backend implement the same
protocol. A backend receives demands that the front has already validated.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from .._core._scheduler import Demand, Grant
from .._host._detect import GPUInfo

__all__ = ["Backend", "PoolSnapshot", "WaiterSnapshot"]


@dataclass(frozen=True, slots=True)
class WaiterSnapshot:
    """One waiting request: ``count`` GPUs of ``fraction`` each, its reservation and wait."""

    count: int
    fraction: float
    reserved: tuple[int, ...]
    waited_s: float
    memory_mib: int | None = None
    """On a pool sized in memory: the MiB asked for on one GPU (None: whole GPUs, a fraction
    pool, or a fraction on GPUs of different sizes, where ``fraction`` says it)."""
    owner: Hashable = None
    """Whose request it is (``owner=`` of an in-process pool; None: the default owner)."""
    priority: int = 0
    """Its priority within its owner's queue."""


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A consistent picture of a GPUPool, taken under its lock."""

    num_gpus: int
    free: tuple[float, ...]
    waiting: tuple[WaiterSnapshot, ...]
    granted: int
    """Grants made (one per request, however many GPUs it holds)."""
    released: int
    """Grants given back in full: ``granted - released`` grants are held now."""
    cancelled: int
    """Requests withdrawn before their grant (cancelled, interrupted, their loop gone)."""
    timed_out: int
    """Requests withdrawn when their timeout passed."""
    free_mib: tuple[int, ...] | None = None
    """On a pool sized in memory: free MiB per GPU (``free`` is then the free share)."""
    total_mib: tuple[int, ...] | None = None
    """On a pool sized in memory: each GPU's total MiB; None on a fraction pool."""
    revoked: int = 0
    """Grants taken back when their time limit (``limit_s``) ran out (counted in
    ``released`` too)."""


class Backend(Protocol):
    """Grant and take back GPU capacity; the GPUPool front is written against this alone.

    A grant returned (or raised past) is owned by the caller until it is passed to
    ``release``. Cancellation, a timeout or KeyboardInterrupt while waiting must leave no
    trace: the request is withdrawn, or a grant that raced ahead is handed back.

    A demand with a ``limit`` (seconds) is one whose grant the backend takes back once held
    that long (the core counts on it): the in-process backend with a timer thread of its
    own, the host server's client by the server's word (``revoked``).

    The front calls ``acquire_now`` first and ``acquire``/``acquire_blocking`` only when it
    returned None, so a backend needs no fast path of its own in those; the demand may have
    become grantable meanwhile, and then they grant at once without queueing. A ``remote``
    backend is the exception: there ``acquire_now`` is a round trip to another process, so
    the front queues at once (``acquire``/``acquire_blocking`` grant at once where
    ``acquire_now`` would have): a wait costs one round trip, not two, and an ``await`` never
    blocks its event loop for the first one.
    """

    remote: bool
    """Whether ``acquire_now`` asks another process (the front then calls it only for the
    nowait calls)."""

    @property
    def gpus(self) -> tuple[GPUInfo, ...]:
        """One entry per logical GPU, in index order (what detection found, or logical ones)."""
        ...

    @property
    def gpu_memory(self) -> tuple[int, ...] | None:
        """Each GPU's capacity in MiB where the GPUs are shared by memory (the core's units
        are then MiB), else None (units are shares of ``UNITS_PER_GPU`` per GPU)."""
        ...

    async def acquire(
        self, demand: Demand, timeout: float | None, expected: float | None = None,
        claim: list[Grant] | None = None,
    ) -> Grant:  # fmt: skip
        """Wait in the queue on the running event loop; raise TimeoutError after ``timeout``.
        ``expected`` (here and below): the caller's hint of the hold time, in seconds.
        ``claim`` (here and below): a list the grant is appended to as the backend hands it
        over; from then on it is the caller's to give back, also when the call is cut short
        (Ctrl-C between the backend's return and the caller's books)."""
        ...

    def acquire_blocking(
        self, demand: Demand, timeout: float | None, expected: float | None = None,
        claim: list[Grant] | None = None,
    ) -> Grant:  # fmt: skip
        """Block the calling thread until granted; raise TimeoutError after ``timeout``."""
        ...

    def acquire_now(
        self, demand: Demand, expected: float | None = None, claim: list[Grant] | None = None
    ) -> Grant | None:
        """Grant at once where that jumps no waiter, else None (never queues). This is the
        hot path: no event loop lookup, no waiter object."""
        ...

    def release(self, grant: Grant) -> None:
        """Give back ``grant``: one returned by an ``acquire*`` call, or a part of one (the same
        ticket and units, a subset of its GPUs; the front releases ``acquire_full`` grants GPU
        by GPU when its caller does). Each GPU of a grant is released once: again raises
        ValueError, changing nothing; of a grant that was revoked (``revoked``) the release
        is a no-op, once. Safe to call after ``close()``. It may run inside a
        finalizer (a lease's task collected by the GC), so it must not block on a lock its
        own thread may hold."""
        ...

    def revoked(self, ticket: int) -> bool:
        """Whether grant ``ticket`` no longer holds its GPUs although its holder has not
        released it: taken back when its time limit (``Demand.limit``) ran out, or by the host
        server (``hwpool cancel``, lost in a restart). Its release is then a no-op."""
        ...

    def snapshot(self) -> PoolSnapshot:
        """Free capacity per GPU, the queue in order and the counters, taken atomically."""
        ...

    def close(self) -> None:
        """Stop serving: later ``acquire*`` calls raise ``hwpool.PoolClosedError``, and so do
        the requests waiting now. Idempotent."""
        ...
