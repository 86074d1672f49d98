"""GPULease (a grant held for the body of a ``with`` block) and ``current_gpus``."""

from __future__ import annotations

import contextlib
import contextvars
from types import TracebackType
from typing import TYPE_CHECKING

from .._core._capacity import units_to_fraction
from .._core._scheduler import Demand, Grant

if TYPE_CHECKING:
    from ._pool import GPUPool

__all__ = ["GPULease", "current_gpus"]

_current: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar(
    "hwpool_current_gpus", default=()
)


def current_gpus() -> list[int]:
    """The GPUs of the innermost lease entered in this context (``[]`` outside any lease)."""
    return list(_current.get())


class GPULease:
    """Holds GPUs from a :class:`GPUPool` for the body of an ``async with`` or ``with`` block.

    ``.gpus`` lists the GPUs held (empty until entered), ``.fraction`` the share of each.
    Inside the block :func:`hwpool.current_gpus` returns ``.gpus``. A lease is entered once and
    releases exactly its own grant, once, when the block ends (also on error or cancellation);
    ``pool.release()`` cannot release it.
    """

    __slots__ = ("_demand", "_grant", "_pool", "_timeout", "_token", "_used")

    def __init__(self, pool: GPUPool, demand: Demand, timeout: float | None) -> None:
        self._pool = pool
        self._demand = demand
        self._timeout = timeout
        self._grant: Grant | None = None
        self._token: contextvars.Token[tuple[int, ...]] | None = None
        self._used = False

    def __repr__(self) -> str:
        return f"GPULease(gpus={self.gpus}, fraction={self.fraction})"

    @property
    def gpus(self) -> list[int]:
        """The GPUs held (empty before the lease is entered and after it is released)."""
        return [] if self._grant is None else list(self._grant.gpus)

    @property
    def fraction(self) -> float:
        """The share of each leased GPU (1.0 for whole GPUs); on a pool sized in memory, the
        share of the GPU granted (before the grant: of the largest GPU)."""
        totals = self._pool._totals
        if totals is None:
            return units_to_fraction(self._demand.units)
        gpus = self._grant.gpus if self._grant is not None else ()
        return self._demand.units / (totals[gpus[0]] if gpus else max(totals))

    @property
    def memory_mib(self) -> int | None:
        """On a pool sized in memory, the MiB this lease holds (or asks for) over all its
        GPUs; None on a fraction pool."""
        if self._pool._totals is None:
            return None
        return self._demand.units * self._demand.count

    def _start(self) -> None:
        if self._used:
            raise RuntimeError("a GPULease can be entered only once; ask the pool for a new one")
        self._used = True

    def _enter(self, grant: Grant) -> list[int]:
        self._grant = grant
        self._token = _current.set(grant.gpus)
        return list(grant.gpus)

    def _exit(self) -> None:
        grant, self._grant = self._grant, None
        if self._token is not None:
            token, self._token = self._token, None
            # Exited in another context than it was entered in: nothing there to restore.
            with contextlib.suppress(ValueError):
                _current.reset(token)
        if grant is not None:
            self._pool._release(grant)

    async def __aenter__(self) -> list[int]:
        self._start()
        pool = self._pool
        grant = pool._acquire_now(self._demand)  # no waiter, no event loop lookup
        if grant is None:
            grant = await pool._backend.acquire(self._demand, self._timeout)
        return self._enter(grant)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()

    def __enter__(self) -> list[int]:
        self._start()
        return self._enter(self._pool._take_blocking(self._demand, self._timeout, "with lease"))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()
