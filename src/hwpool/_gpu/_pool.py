"""GPUPool: the one front (validation, leases, explicit acquire and release) over a backend.

The front checks every argument, then asks its backend (``hwpool._backends``): first for a
grant at once (``acquire_now``, the cheap path that needs no event loop and no waiter), and only
if there is none for a place in the queue. Over a ``remote`` backend (the host server's client)
that first question would be a round trip of its own, blocking, so there the front queues at
once (``_try_now`` is then ``_no_grant``). The in-process backend is the default; the host
server's client plugs in with ``GPUPool(backend=...)``.

Explicit releases are tied to grants: the front keeps, per GPU, the grants its ``acquire*``
calls handed out, and ``release(gpu, fraction)`` gives back one of those (a lease releases its
own grant and is not among them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Hashable, Mapping, Sequence
from types import TracebackType

from .._backends._base import Backend, PoolSnapshot
from .._backends._local import LocalBackend
from .._backends._unix import SOCKET_VAR, UnixBackend
from .._check import check_int, check_timeout
from .._core._capacity import UNITS_PER_GPU, units_to_fraction
from .._core._demand import Demands, with_terms
from .._core._fairshare import DEFAULT_HALF_LIFE, check_half_life, check_shares
from .._core._scheduler import BACKFILLS, Demand, Grant
from .._errors import WouldBlock
from .._host._detect import GPUInfo, detect_gpus
from .._host._visible import no_gpu_message
from ._lease import GPULease
from ._sizing import capacities_of, sized_gpus

__all__ = ["GPUPool"]


class GPUPool:
    """Fractional and whole-GPU leases for any number of asyncio tasks and threads.

    ``GPUPool(num_gpus)`` manages ``num_gpus`` logical GPUs; ``GPUPool()`` detects them with
    :func:`hwpool.detect_gpus` (one logical GPU when no hardware is found, so GPU code runs
    anywhere; ValueError naming ``CUDA_VISIBLE_DEVICES`` when that variable hides every GPU,
    e.g. ``""``, ``-1`` or Slurm's ``NoDevFiles``: see docs/gpus.md), or, when
    ``HWPOOL_SOCKET`` is set, is the host server's pool there (see ``hwpool.connect``).
    ``GPUPool(backend=b)`` is the same front over another backend (e.g. the host server's
    client). Requests are served by one FIFO queue with reservations, best fit and backfill
    (see the scheduler core); cancelling or timing out a waiter never leaks capacity.

    ``GPUPool(memory=True)`` sizes each detected GPU by its memory (one unit per MiB) and
    ``GPUPool(gpu_memory=["80GiB", "24GiB"])`` makes logical GPUs of those sizes: requests
    then give ``memory=`` (see ``hwpool._gpu._sizing``). ``hwpool.connect()`` to a server
    started with ``hwpool serve --memory`` (or ``--gpu-memory``) is sized in memory the same way.
    On GPUs of different sizes, whole GPUs are completely free ones of any size and a fraction
    below 1 is that share of the GPU it is granted (``0.5``: 40 GiB on an 80 GiB GPU, 12 GiB
    on a 24 GiB one); ``release(gpu, fraction)`` gives back that share of ``gpu``.
    ``GPUPool(memory=True, reserve_in_use=True)`` leaves alone the memory that was in use on
    each GPU when the pool was made (a desktop session, another job): a GPU's capacity is its
    total less that reading, taken once. ValueError where a GPU's use is unknown or nothing is
    left on it; TypeError without ``memory=True`` or with ``gpu_memory``. It is admission, not
    enforcement: a process can still allocate past its lease, or outside hwpool.

    ``policy`` picks the core's scheduling policy for an in-process pool: ``"easy"`` (the
    default) or ``"reserve-all"`` (every waiter reserves; the policy hwpool started from).
    ``backfill`` (in-process ``"easy"`` only) says what may start on the GPUs the head of the
    queue waits for, before it is expected to fit: ``"estimates"`` (the default in-process:
    work expected to end in time, by ``limit_s``, ``expected_s`` or the hold times learned;
    the pool's work is one program's, whose estimates it trusts, and more of it starts
    early) or ``"limits"`` (only work whose ``limit_s`` ends in time, so that the head's
    wait has a bound no estimate can stretch: the host server's rule, where requests come
    from users who may not tell the truth; pick it for a pool whose owners are tenants).

    Owners: every ``acquire*`` and ``lease*`` takes ``owner=`` (any hashable: a tenant, an
    API key; default None, one owner for all) and ``priority=`` (an int, higher first within
    that owner). Between owners the queue is a fair share: the owner with the least recent
    GPU-seconds (decayed with ``half_life`` seconds, default an hour) per share goes first;
    ``shares`` maps owners to their share (default 1). With one owner nothing changes. Over
    the host server (``HWPOOL_SOCKET``, ``backend=``) the owner is the calling user (its uid;
    ``owner`` is not sent) and the server's config sets shares; ``priority`` is sent
    (-1000..1000) and orders that user's requests only.

    Time limits: every ``acquire*`` and ``lease*`` takes ``limit_s=`` (seconds, finite and
    > 0). Once a grant has been held that long the pool **revokes** it: its capacity goes
    back to the pool (so that the request at the head of the queue, which the policy let
    others run in front of only on the strength of such limits, starts on time), the lease's
    ``revoked`` turns True (``snapshot().revoked`` counts them), and its release becomes a
    no-op. The holder is not interrupted: nothing is cancelled or raised in it, since a task
    or thread cut at an arbitrary point could leave its own state broken; it is told by
    ``lease.revoked`` and must stop using the GPUs (a child process it started should be
    ended; ``hwpool run --time`` does that). In-process a thread of the pool (run only while
    limited grants are held) revokes on the pool's clock; over the host server the server
    revokes and tells the client. On the host server a limit is the only thing that lets a
    request start in front of a waiting wide one (``expected_s`` is a hint and passes
    nobody there); in-process, by default, an expected hold does too (``backfill``).
    """

    def __init__(
        self,
        num_gpus: int | None = None,
        *,
        backend: Backend | None = None,
        memory: bool = False,
        gpu_memory: Sequence[int | str] | None = None,
        policy: str | None = None,
        reserve_in_use: bool = False,
        shares: Mapping[Hashable, float] | None = None,
        half_life: float | None = None,
        backfill: str | None = None,
    ) -> None:
        owned = check_shares(shares)
        if backfill is not None and (backfill not in BACKFILLS or not isinstance(backfill, str)):
            raise ValueError(f"backfill must be one of {', '.join(BACKFILLS)}; got {backfill!r}")
        if backfill is not None and backend is not None:
            raise TypeError(
                f"give backend or backfill (an in-process pool's), not both (backfill={backfill!r})"
            )
        trust = "estimates" if backfill is None else backfill
        life = DEFAULT_HALF_LIFE if half_life is None else check_half_life(half_life)
        if backend is not None and (shares is not None or half_life is not None):
            raise TypeError(
                f"give backend or shares/half_life (an in-process pool's), not both "
                f"(shares={shares!r}, half_life={half_life!r})"
            )
        sized = sized_gpus(num_gpus, memory, gpu_memory, reserve_in_use)
        self._in_use = tuple(g.memory_used_mib or 0 for g in sized or ()) if reserve_in_use else ()
        if backend is not None and policy is not None:
            raise TypeError(f"give backend or policy, not both (policy={policy!r})")
        rule = "easy" if policy is None else policy
        if sized is not None:
            if backend is not None:
                raise TypeError("give backend or a memory size (memory=, gpu_memory=), not both")
            totals = capacities_of(sized, reserve_in_use is True)
            backend = LocalBackend(
                sized, totals=totals, policy=rule, shares=owned, half_life=life, backfill=trust
            )
        elif (
            backend is None
            and num_gpus is None
            and policy is None
            and shares is None
            and half_life is None
            and backfill is None
            and os.environ.get(SOCKET_VAR)
        ):
            backend = UnixBackend()  # the host-wide queue, with no change to the code
        elif backend is None:
            backend = LocalBackend(
                _pool_gpus(num_gpus), policy=rule, shares=owned, half_life=life, backfill=trust
            )
        elif num_gpus is not None:
            raise TypeError(f"give num_gpus or backend, not both (num_gpus={num_gpus!r})")
        self._backend = backend
        self._gpus = backend.gpus
        self._totals = backend.gpu_memory
        self._num_gpus = len(self._gpus)
        single = any(gpu.is_mig for gpu in self._gpus)  # a process uses one MIG instance
        self._demands = Demands(self._totals, self._num_gpus, single_whole=single)
        self._by_fraction = self._demands.fractions  # float fraction -> demand: the hot path
        self._acquire_now = backend.acquire_now  # the hot paths, looked up once
        self._try_now = _no_grant if getattr(backend, "remote", False) else self._acquire_now
        self._release = backend.release
        # Per GPU, the grants of acquire* calls not yet released (list ops are atomic).
        self._held: list[list[Grant]] = [[] for _ in range(self._num_gpus)]

    def __repr__(self) -> str:
        if self._in_use:
            return (
                f"GPUPool(gpu_memory={[f'{t}MiB' for t in self._totals or ()]}, "
                f"in_use_at_start={[f'{u}MiB' for u in self._in_use]})"
            )
        if self._totals is not None:
            return f"GPUPool(gpu_memory={[f'{t}MiB' for t in self._totals]})"
        return f"GPUPool(num_gpus={self._num_gpus})"

    @property
    def num_gpus(self) -> int:
        """The number of logical GPUs this pool shares out."""
        return self._num_gpus

    @property
    def gpus(self) -> tuple[GPUInfo, ...]:
        """What is known of each logical GPU, in index order: ``device_id`` (for
        ``CUDA_VISIBLE_DEVICES``), ``uuid``, ``memory_mib``, ``name`` and, for a MIG instance,
        ``parent``, where detection found them, and ``memory_used_mib`` as it was then (the
        totals and the use as detected, also where ``reserve_in_use`` took the use off)."""
        return self._gpus

    @property
    def gpu_memory(self) -> tuple[int, ...] | None:
        """Each GPU's capacity in MiB for a pool sized in memory (with ``reserve_in_use``,
        its total less the memory in use at the start); None for a fraction pool."""
        return self._totals

    # ----------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Stop granting: later ``acquire*`` calls and the requests waiting now raise
        :class:`hwpool.PoolClosedError`. Releasing what is still held stays allowed. Idempotent."""
        self._backend.close()

    def __enter__(self) -> GPUPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------- async
    async def acquire(
        self,
        fraction: float | None = None,
        *,
        memory: int | str | None = None,
        timeout: float | None = None,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> int:
        """Wait for ``fraction`` (0 < fraction <= 1, default 1) of one GPU, or for ``memory``
        (MiB or ``"6GiB"``) on a pool sized in memory; return the GPU's index.

        Raises TimeoutError after ``timeout`` seconds; give it back with
        ``release(gpu, fraction)`` (or ``release(gpu, memory=...)``). ``expected_s`` (every
        ``acquire*`` and ``lease*`` takes it): how long you expect to hold it, in seconds,
        which the policy then uses instead of what it learned of requests of this size.
        ``limit_s``: revoke the grant once held that long (see the class doc); its
        ``release`` is then a no-op.
        """
        # A float seen before is looked up at once (self._demands.one's memo): the hot path.
        demand = self._by_fraction.get(fraction) if fraction.__class__ is float else None
        if demand is None or memory is not None:
            demand = self._demands.one(fraction, memory)
        if owner is not None or priority.__class__ is not int or priority or limit_s is not None:
            demand = with_terms(demand, owner, priority, limit_s)
        if timeout is not None:
            timeout = check_timeout(timeout)
        if expected_s is not None:
            expected_s = check_timeout(expected_s, "expected_s")
        claim: list[Grant] = []  # what the backend hands over: ours to give back if cut short
        try:
            if self._try_now(demand, expected_s, claim) is None:
                await self._backend.acquire(demand, timeout, expected_s, claim)
            grant = claim[0]
            gpus = grant.gpus
            if len(gpus) == 1:  # self._keep(grant), inline: the hot path
                self._held[gpus[0]].append(grant)
                return gpus[0]
            return self._keep(grant)[0]
        except BaseException:
            self._unclaim(claim)
            raise

    async def acquire_full(
        self,
        count: int,
        *,
        timeout: float | None = None,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> list[int]:
        """Wait for ``count`` completely free GPUs, granted together; return their indices.

        Give each back with ``release(gpu)``.
        """
        demand = with_terms(self._demands.whole(count), owner, priority, limit_s)
        timeout = check_timeout(timeout)
        expected_s = check_timeout(expected_s, "expected_s")
        claim: list[Grant] = []
        try:
            if self._try_now(demand, expected_s, claim) is None:
                await self._backend.acquire(demand, timeout, expected_s, claim)
            gpus = self._keep(claim[0])
        except BaseException:
            self._unclaim(claim)
            raise
        return gpus

    # ----------------------------------------------------------------- blocking
    def acquire_blocking(
        self,
        fraction: float | None = None,
        *,
        memory: int | str | None = None,
        timeout: float | None = None,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> int:
        """Like :meth:`acquire`, for threads: block until granted or ``timeout`` passes.

        Raises RuntimeError in a thread that runs an event loop (it would freeze the loop,
        and deadlock if the holder is a task on it): use ``await pool.acquire()`` there.
        """
        demand = with_terms(self._demands.one(fraction, memory), owner, priority, limit_s)
        hint = check_timeout(expected_s, "expected_s")
        claim: list[Grant] = []
        try:
            self._take_blocking(demand, check_timeout(timeout), "acquire_blocking()", hint, claim)
            gpus = self._keep(claim[0])
        except BaseException:
            self._unclaim(claim)
            raise
        return gpus[0]

    def acquire_full_blocking(
        self,
        count: int,
        *,
        timeout: float | None = None,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> list[int]:
        """Like :meth:`acquire_full`, for threads (RuntimeError on an event loop's thread)."""
        demand = with_terms(self._demands.whole(count), owner, priority, limit_s)
        hint = check_timeout(expected_s, "expected_s")
        what = "acquire_full_blocking()"
        claim: list[Grant] = []
        try:
            self._take_blocking(demand, check_timeout(timeout), what, hint, claim)
            gpus = self._keep(claim[0])
        except BaseException:
            self._unclaim(claim)
            raise
        return gpus

    def _take_blocking(
        self, demand: Demand, timeout: float | None, what: str, expected: float | None,
        claim: list[Grant],
    ) -> Grant:  # fmt: skip
        """Wait for ``demand`` in this thread; the grant is also appended to ``claim`` (see
        :meth:`_unclaim`)."""
        if asyncio._get_running_loop() is not None:
            raise RuntimeError(
                f"{what} called in a thread that runs an event loop: it would block the loop "
                "(and never return if a task of this loop holds the GPUs); use "
                "'await pool.acquire()' or 'async with pool.lease()' there"
            )
        grant = self._try_now(demand, expected, claim)
        if grant is not None:
            return grant
        return self._backend.acquire_blocking(demand, timeout, expected, claim)

    # ----------------------------------------------------------------- nowait
    def acquire_nowait(
        self,
        fraction: float | None = None,
        *,
        memory: int | str | None = None,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> int:
        """Take ``fraction`` of a GPU (or ``memory``) now, or raise :class:`hwpool.WouldBlock`.

        Never jumps the queue: granted only where the policy lets a new arrival start.
        """
        demand = with_terms(self._demands.one(fraction, memory), owner, priority, limit_s)
        return self._take_now(demand, check_timeout(expected_s, "expected_s"))[0]

    def acquire_full_nowait(
        self,
        count: int,
        *,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> list[int]:
        """Take ``count`` whole GPUs now, or raise :class:`hwpool.WouldBlock`."""
        demand = with_terms(self._demands.whole(count), owner, priority, limit_s)
        return self._take_now(demand, check_timeout(expected_s, "expected_s"))

    def _take_now(self, demand: Demand, expected: float | None = None) -> list[int]:
        """Grant ``demand`` now and keep it; its GPUs (WouldBlock if it would wait)."""
        claim: list[Grant] = []
        try:
            if self._acquire_now(demand, expected, claim) is not None:
                return self._keep(claim[0])
        except BaseException:
            self._unclaim(claim)
            raise
        sized = self._totals is not None and demand.count == 1 and not demand.whole
        what = f"{demand.units} MiB" if sized and not demand.relative else _describe(demand)
        raise WouldBlock(f"no GPU can take {what} without waiting")

    # ----------------------------------------------------------------- release
    def release(
        self, gpu_id: int, fraction: float | None = None, *, memory: int | str | None = None
    ) -> None:
        """Give back a grant of ``fraction`` (default 1) or ``memory`` on GPU ``gpu_id`` from
        this pool's ``acquire*`` calls (for ``acquire_full``: ``release(gpu)`` for each GPU).
        On a pool sized in memory, ``fraction`` is that share of GPU ``gpu_id``'s total.

        Raises ValueError, changing nothing, when no such grant is held: released already,
        held by a lease (a lease releases itself), or never granted. TypeError for a wrong type.
        """
        if self._totals is None:  # a fraction pool: the units do not depend on the GPU
            demand = self._by_fraction.get(fraction) if fraction.__class__ is float else None
            if demand is None or memory is not None:
                demand = self._demands.one(fraction, memory)
            units = demand.units
        if type(gpu_id) is not int or not 0 <= gpu_id < self._num_gpus:
            gpu_id = check_int("gpu_id", gpu_id, minimum=0, maximum=self._num_gpus - 1)
        if self._totals is not None:  # MiB: a fraction's depend on the GPU, checked first
            units = self._demands.units(gpu_id, fraction, memory)
        held = self._held[gpu_id]
        try:
            grant: Grant | None = held[-1]  # the common case: the grant was kept last
        except IndexError:
            grant = None
        if grant is None or grant.units != units:
            grant = self._forget(held, units)
        else:
            try:
                held.remove(grant)
            except ValueError:  # another thread released it meanwhile
                grant = self._forget(held, units)
            except BaseException:  # Ctrl-C right after the removal: the release must follow
                self._release_anyway(grant)
                raise
        if grant is None:
            asked = f"memory={memory!r}" if memory is not None else f"fraction={fraction!r}"
            what = f"{units} MiB" if self._totals is not None else units_to_fraction(units)
            raise ValueError(
                f"gpu_id={gpu_id}, {asked}: this pool's acquire calls hold no "
                f"grant of {what} on GPU {gpu_id} (released already, or "
                "held by a lease, which releases itself)"
            )
        try:
            self._release(grant)
        except ValueError:
            raise
        except BaseException:  # cut short (Ctrl-C) on its way in or out: a full effect
            self._release_anyway(grant)
            raise

    def _release_anyway(self, grant: Grant) -> None:
        """Finish the release of ``grant``, taken off the books by a release that was cut
        short: a release that raises has had its full effect (ValueError: it had already)."""
        with contextlib.suppress(ValueError):
            self._release(grant)

    def _unclaim(self, claim: list[Grant]) -> None:
        """A call that took a grant (in ``claim``) was cut short (Ctrl-C, a cancellation)
        before it returned: take what ``_keep`` kept of it off the books and give it back,
        so that the call raises holding nothing."""
        if not claim:
            return
        grant = claim.pop()
        for gpu in grant.gpus:
            held = self._held[gpu]
            for kept in [g for g in held if g.ticket == grant.ticket]:
                with contextlib.suppress(ValueError):
                    held.remove(kept)
        with contextlib.suppress(ValueError):  # revoked meanwhile: its release is a no-op
            self._release(grant)

    def _keep(self, grant: Grant) -> list[int]:
        """Remember ``grant`` for ``release``, GPU by GPU; return its GPUs.

        A grant of several GPUs is kept as one part per GPU (the same ticket and units), since
        each is released on its own.
        """
        gpus = grant.gpus
        if len(gpus) == 1:
            self._held[gpus[0]].append(grant)
        elif grant.units:
            for gpu in gpus:
                self._held[gpu].append(Grant(grant.ticket, (gpu,), grant.units))
        else:  # whole GPUs of different sizes: each part holds its GPU's total
            assert self._totals is not None
            for gpu in gpus:
                self._held[gpu].append(Grant(grant.ticket, (gpu,), self._totals[gpu]))
        return list(gpus)

    def _forget(self, held: list[Grant], units: int) -> Grant | None:
        """Take the oldest kept grant of ``units`` in ``held`` off the books (None: none is).

        Other threads may change the list meanwhile: scan a copy, remove by identity, retry.
        """
        while True:
            for grant in tuple(held):
                if grant.units == units:
                    break
            else:
                return None
            try:
                held.remove(grant)
            except ValueError:  # another thread released it first: look again
                continue
            except BaseException:  # Ctrl-C right after the removal: the release must follow
                self._release_anyway(grant)
                raise
            return grant

    # ----------------------------------------------------------------- leases
    def lease(
        self,
        fraction: float | None = None,
        *,
        memory: int | str | None = None,
        timeout: float | None = None,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> GPULease:
        """A lease of ``fraction`` of one GPU (or of ``memory`` on a pool sized in memory),
        for ``async with`` or a plain ``with``."""
        return GPULease(
            self,
            with_terms(self._demands.one(fraction, memory), owner, priority, limit_s),
            None if timeout is None else check_timeout(timeout),
            None if expected_s is None else check_timeout(expected_s, "expected_s"),
        )

    def lease_full(
        self,
        count: int,
        *,
        timeout: float | None = None,
        expected_s: float | None = None,
        owner: Hashable = None,
        priority: int = 0,
        limit_s: float | None = None,
    ) -> GPULease:
        """A lease of ``count`` whole GPUs, for ``async with`` or a plain ``with``."""
        hint = check_timeout(expected_s, "expected_s")
        demand = with_terms(self._demands.whole(count), owner, priority, limit_s)
        return GPULease(self, demand, check_timeout(timeout), hint)

    # ----------------------------------------------------------------- hand-over
    def take_over(self, lease_id: int, ticket: str) -> GPULease:
        """The lease ``lease_id`` that another process of this user gave up with
        :meth:`GPULease.hand_over` (which returned ``ticket``), held by this pool from now on.

        The lease is held already: ``.gpus``, ``.devices``, ``.env()``, ``.fraction``,
        ``.memory_mib``, ``.revoked`` work at once; use it in a ``with`` (or ``async with``)
        block, whose end releases it (its GPUs are current inside). It keeps its id, GPUs and
        time limit (``limit_s`` counts from its first grant). A ticket is used once.

        TypeError for an in-process pool (only the host server's leases change process);
        TypeError or ValueError naming ``lease_id`` or ``ticket`` for a bad one; ValueError
        when the server has no such lease offered to this user with this ticket (wrong,
        used, its giver gone); ConnectionError if it does not answer.
        """
        backend = self._backend
        take = getattr(backend, "take", None)
        demand_of = getattr(backend, "demand_of", None)
        if take is None or demand_of is None:
            raise TypeError(
                f"take_over(lease_id={lease_id!r}, ...) needs a pool of the host server "
                f"(hwpool.connect()); {self!r} is an in-process pool, which takes no lease "
                "from another process"
            )
        grant: Grant = take(lease_id, ticket)
        demand: Demand | None = demand_of(grant.ticket)
        if demand is None:  # revoked in the meantime: a lease of the GPUs it had
            demand = Demand(len(grant.gpus), grant.units or UNITS_PER_GPU)
        lease = GPULease(self, demand, None)
        lease._taken(grant)
        return lease

    # ----------------------------------------------------------------- introspection
    def snapshot(self) -> PoolSnapshot:
        """Free capacity per GPU, the waiting queue and the counters, taken atomically."""
        return self._backend.snapshot()

    # ----------------------------------------------------------------- demands
    def _whole_demand(self, count: int) -> Demand:
        """``count`` whole GPUs of this pool (validated)."""
        return self._demands.whole(count)

    def _one_demand(self, fraction: object, memory: object) -> Demand:
        """The one-GPU demand for ``fraction`` or ``memory`` on this pool (validated)."""
        return self._demands.one(fraction, memory)


def _no_grant(
    demand: Demand, expected: float | None = None, claim: list[Grant] | None = None
) -> Grant | None:
    """The front's first question to a remote backend: none (it queues at once instead)."""
    return None


def _pool_gpus(num_gpus: object) -> tuple[GPUInfo, ...]:
    """The GPUs of a local pool: ``num_gpus`` logical ones, or what detection finds (one
    logical GPU when it finds no hardware). ValueError when ``CUDA_VISIBLE_DEVICES`` hides
    every GPU: a pool there would hand children GPUs this process was denied."""
    if num_gpus is None:
        found = detect_gpus()
        if not found.gpus:
            raise ValueError(no_gpu_message(found.detail, "GPUPool()") + _LOGICAL)
        return found.gpus
    count = check_int("num_gpus", num_gpus, minimum=1)
    return tuple(GPUInfo(i, str(i)) for i in range(count))


_LOGICAL = (
    ", or give GPUPool(num_gpus=N) (or HWPOOL_NUM_GPUS=N) for N logical GPUs, numbered "
    "0..N-1 in children's CUDA_VISIBLE_DEVICES whatever this process may see"
)


def _describe(demand: Demand) -> str:
    if demand.count > 1 or demand.whole:
        return f"{demand.count} whole GPU(s)"
    share = f"fraction={units_to_fraction(demand.units)}"
    return f"{share} of a GPU of any size" if demand.relative else share
