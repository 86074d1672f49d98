"""GPULease (a grant held for the body of a ``with`` block) and ``current_gpus``."""

from __future__ import annotations

import contextlib
import contextvars
import subprocess
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Protocol

from .._backends._base import Backend
from .._core._capacity import units_to_fraction
from .._core._scheduler import Demand, Grant
from .._host._detect import GPUInfo
from . import _env

__all__ = ["GPULease", "LeasePool", "current_gpus"]


class LeasePool(Protocol):
    """What a lease uses of the pool it came from (``GPUPool`` is the one): its backend, its
    GPUs and their sizes, and its grant and release paths. Declared here, so that this module
    needs nothing from the pool's module (which imports this one)."""

    _backend: Backend
    _totals: tuple[int, ...] | None

    @property
    def gpus(self) -> tuple[GPUInfo, ...]: ...

    def _try_now(
        self, demand: Demand, expected: float | None = None, claim: list[Grant] | None = None
    ) -> Grant | None: ...

    def _release(self, grant: Grant) -> None: ...

    def _take_blocking(
        self, demand: Demand, timeout: float | None, what: str, expected: float | None,
        claim: list[Grant],
    ) -> Grant: ...  # fmt: skip


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

    For code that runs elsewhere, ``.devices`` names the leased GPUs as ``CUDA_VISIBLE_DEVICES``
    wants them, ``.env()`` is the environment a child process needs, and ``.popen()`` /
    ``.run()`` start one with it.

    A lease asked for with ``limit_s`` is revoked once held that long: ``.revoked`` turns
    True, the GPUs go back to the pool, and the end of the block releases nothing.

    A lease of the host server can change process: ``.hand_over()`` gives it up for another
    process of the same user, which takes it with ``pool.take_over(lease.id, ticket)``; the
    block of the giver then releases nothing, and the taker's lease releases it.
    """

    __slots__ = (
        "_claim", "_demand", "_expected", "_grant", "_pool", "_revoked", "_timeout", "_token",
        "_used",
    )  # fmt: skip

    def __init__(
        self,
        pool: LeasePool,
        demand: Demand,
        timeout: float | None,
        expected: float | None = None,
    ) -> None:
        self._pool = pool
        self._demand = demand
        self._timeout = timeout
        self._expected = expected
        self._grant: Grant | None = None
        self._claim: list[Grant] | None = None  # while entering: what the backend handed over
        self._token: contextvars.Token[tuple[int, ...]] | None = None
        self._used = False
        self._revoked = False

    @property
    def id(self) -> int | None:
        """The host server's id of this lease (as ``hwpool status`` shows it, and as
        :meth:`GPUPool.take_over` takes it); None in an in-process pool, before the lease is
        granted, and once it is released or handed over."""
        grant = self._grant
        lease_id = getattr(self._pool._backend, "lease_id", None)
        if grant is None or lease_id is None:
            return None
        ident: int | None = lease_id(grant.ticket)
        return ident

    def hand_over(self) -> str:
        """Give this lease up for another process of the same user to take: the ticket it
        takes it with (a secret: pass it, with ``.id``, only to that process), which then
        calls ``GPUPool.take_over(id, ticket)`` on its own connection to the host server.

        From now on this lease holds nothing here (``.gpus`` is empty, the end of its block
        releases nothing); the server keeps it for this pool's connection until it is taken,
        and frees it if that connection closes first (``pool.close()``, this process's exit)
        or the server restarts first. TypeError for a lease of an in-process pool (it cannot
        leave its process); RuntimeError when it holds nothing (not entered, released, handed
        over); ValueError when the server refuses (revoked meanwhile); nothing changes then.
        """
        give = getattr(self._pool._backend, "give", None)
        if give is None:
            raise TypeError(
                f"hand_over() needs a lease of the host server (hwpool.connect()); "
                f"{self._pool!r} is an in-process pool, whose leases cannot leave its process"
            )
        grant = self._grant
        if grant is None:
            raise RuntimeError(
                "this GPULease holds no GPU (not entered yet, released, or handed over "
                "already): nothing to hand over"
            )
        ticket: str = give(grant)
        self._grant = None  # the end of the block releases nothing
        return ticket

    @property
    def limit_s(self) -> float | None:
        """The time limit asked for (seconds; None: none)."""
        return self._demand.limit

    @property
    def revoked(self) -> bool:
        """Whether the pool took this lease back before its holder released it: its
        ``limit_s`` ran out (or, over the host server, ``hwpool cancel`` revoked it, or a
        restarted server lost it). Its GPUs may then be someone else's: stop using them."""
        if self._revoked:
            return True
        grant = self._grant
        return grant is not None and self._pool._backend.revoked(grant.ticket)

    def __repr__(self) -> str:
        return f"GPULease(gpus={self.gpus}, fraction={self.fraction})"

    @property
    def gpus(self) -> list[int]:
        """The GPUs held (empty before the lease is entered and after it is released)."""
        return [] if self._grant is None else list(self._grant.gpus)

    @property
    def fraction(self) -> float:
        """The share of each leased GPU (1.0 for whole GPUs); on a pool sized in memory, the
        share of the GPU granted (before the grant: of the largest GPU, or for a fraction on
        GPUs of different sizes the fraction asked for)."""
        totals, demand, grant = self._pool._totals, self._demand, self._grant
        if totals is None:
            return units_to_fraction(demand.units)
        if demand.whole:
            return 1.0
        if demand.relative:  # the MiB taken depend on the GPU granted
            if grant is None:
                return units_to_fraction(demand.units)
            return grant.units / totals[grant.gpus[0]]
        gpus = grant.gpus if grant is not None else ()
        return demand.units / (totals[gpus[0]] if gpus else max(totals))

    @property
    def memory_mib(self) -> int | None:
        """On a pool sized in memory, the MiB this lease holds (or asks for) over all its
        GPUs; None on a fraction pool, and for a fraction on GPUs of different sizes until it
        is granted (what it takes depends on the GPU)."""
        totals = self._pool._totals
        if totals is None:
            return None
        if self._demand.relative:
            return None if self._grant is None else self._grant.units
        if self._demand.whole and self._grant is not None:  # whole GPUs of different sizes
            return sum(totals[gpu] for gpu in self._grant.gpus)
        return self._demand.units * self._demand.count

    @property
    def devices(self) -> list[str]:
        """The ``CUDA_VISIBLE_DEVICES`` entry of each leased GPU, in ``.gpus`` order: its UUID
        when detection found one, else the inherited ``CUDA_VISIBLE_DEVICES`` entry, else
        its index (empty while the lease holds nothing)."""
        return _env.lease_devices(self._pool.gpus, self.gpus)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a child process on this lease's GPUs: ``base`` (default
        ``os.environ``) with ``CUDA_VISIBLE_DEVICES`` (``.devices``),
        ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``HWPOOL_LEASE`` (JSON: ``gpus``, ``fraction``,
        ``devices``; ``memory_mib`` on a pool sized in memory; ``memory_share`` for part of a
        GPU; ``id`` and ``socket`` for a lease of the host server) set, and
        ``HWPOOL_SOCKET`` removed. For part of a GPU, also JAX's memory knobs
        (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, ``XLA_PYTHON_CLIENT_MEM_FRACTION``) where
        ``base`` does not set them. RuntimeError when the lease holds no GPU (not entered, or
        released): a child started then would see every GPU."""
        grant = self._grant
        if grant is None:
            raise RuntimeError("this GPULease holds no GPU (enter it first): no env() to give")
        devices = _env.lease_devices(self._pool.gpus, grant.gpus)
        share = self._memory_share(grant)
        about = _env.describe_lease(
            self._pool._backend, grant.ticket, grant.gpus, self.fraction, devices,
            memory_mib=self.memory_mib, share=share,
        )  # fmt: skip
        return _env.lease_environment(devices, about, base, share)

    def _memory_share(self, grant: Grant) -> float | None:
        """The share of each leased GPU's total memory this lease may use: its fraction, or
        its MiB over the GPU's total; None for whole GPUs, a share of 1 (a whole GPU too) or a
        total not known."""
        demand = self._demand
        if demand.whole or demand.count > 1:
            return None
        totals = self._pool._totals
        fraction = units_to_fraction(demand.units) if totals is None or demand.relative else None
        share = _env.memory_share(
            self._pool.gpus, grant.gpus, fraction=fraction, mib_each=demand.units,
            pool_totals=totals,
        )  # fmt: skip
        return None if share is None or share >= 1.0 else share

    def popen(self, args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(args, **kwargs)`` with ``env=self.env(kwargs.get("env"))``: every
        ``subprocess`` option works; an ``env=`` given is the base the lease's variables go on."""
        kwargs["env"] = self.env(kwargs.get("env"))
        return subprocess.Popen(args, **kwargs)

    def run(self, args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run(args, **kwargs)`` with the lease's environment, as :meth:`popen`."""
        kwargs["env"] = self.env(kwargs.get("env"))
        return subprocess.run(args, **kwargs)  # noqa: PLW1510 (check= is the caller's)

    def _taken(self, grant: Grant) -> None:
        """Hold ``grant`` (a lease taken over) before any block: entering the lease then only
        makes its GPUs current, and its end releases it."""
        self._grant = grant

    def _start(self) -> None:
        if self._used:
            raise RuntimeError("a GPULease can be entered only once; ask the pool for a new one")
        self._used = True

    def _enter(self, grant: Grant) -> list[int]:
        self._grant = grant
        self._claim = None
        self._token = _current.set(grant.gpus)
        return list(grant.gpus)

    def __del__(self) -> None:
        # A lease dropped holding a grant: its enter or exit was cut short where no code of
        # its own could run (Ctrl-C at the very entry of __exit__ or of a handler). Give the
        # grant back, where the backend's release is safe in a finalizer (the in-process one:
        # it never waits for a lock); a host server frees it when the connection closes.
        # Its GPUs stop being current_gpus() where they still are (the same tuple: no later
        # lease's, which would be another).
        # (getattr: Ctrl-C may have cut __init__ short before its fields were set.)
        grant, token = getattr(self, "_grant", None), getattr(self, "_token", None)
        claim = getattr(self, "_claim", None)
        if grant is None and claim:
            grant = claim[0]
        if grant is None:
            return
        if token is not None and _current.get() is grant.gpus:
            with contextlib.suppress(ValueError, RuntimeError):  # another context, or reset
                _current.reset(token)
        if getattr(self._pool._backend, "releases_in_finalizer", False):
            with contextlib.suppress(Exception):  # released meanwhile, or revoked
                self._pool._release(grant)

    def _exit(self) -> None:
        grant, token = self._grant, self._token
        try:
            if token is not None:
                try:  # noqa: SIM105 (contextlib.suppress costs more than the rest of the exit)
                    _current.reset(token)
                except ValueError:  # exited in another context than entered: nothing to restore
                    pass
            if grant is not None:
                self._revoked = self._pool._backend.revoked(grant.ticket)
                self._pool._release(grant)
        except BaseException:  # cut short (Ctrl-C): the exit still has its full effect
            self._cut_short(grant, token, None)
            raise
        self._grant = self._token = None

    def _cut_short(
        self, grant: Grant | None, token: contextvars.Token[tuple[int, ...]] | None,
        before: tuple[int, ...] | None,
    ) -> None:  # fmt: skip
        """An enter or exit was cut short (Ctrl-C, a cancellation): end the lease as if it had
        run to its end, so that the call raises holding nothing. ``before``: the current GPUs
        before an enter (restored where its token was lost). The grant goes first and stays
        on the lease until it has: cut short again, the lease's finalizer still has it."""
        if grant is not None:
            with contextlib.suppress(ValueError):  # released already, or revoked
                self._pool._release(grant)
        self._grant = self._token = self._claim = None
        if token is not None:
            with contextlib.suppress(ValueError, RuntimeError):  # another context, or reset
                _current.reset(token)
        elif before is not None:
            _current.set(before)

    def _claimed(self, claim: list[Grant], before: tuple[int, ...]) -> None:
        """An enter was cut short after (maybe) taking the grant in ``claim``."""
        self._cut_short(claim[0] if claim else None, self._token, before)

    async def __aenter__(self) -> list[int]:
        if self._used:
            self._start()  # raises
        self._used = True
        if self._grant is not None:  # taken over: held already
            return self._enter(self._grant)
        pool = self._pool
        expected = self._expected
        claim: list[Grant] = []  # what the backend hands over: ours to give back if cut short
        self._claim = claim
        before = _current.get()
        try:
            if pool._try_now(self._demand, expected, claim) is None:  # no waiter, no loop
                await pool._backend.acquire(self._demand, self._timeout, expected, claim)
            return self._enter(claim[0])
        except BaseException:
            self._claimed(claim, before)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()

    def __enter__(self) -> list[int]:
        self._start()
        if self._grant is not None:  # taken over: held already
            return self._enter(self._grant)
        claim: list[Grant] = []
        self._claim = claim
        before = _current.get()
        try:
            self._pool._take_blocking(
                self._demand, self._timeout, "with lease", self._expected, claim
            )
            return self._enter(claim[0])
        except BaseException:
            self._claimed(claim, before)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()
