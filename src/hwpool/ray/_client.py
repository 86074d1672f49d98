"""A driver's client: the actor that waits for GPUs and launches the work on them.

``pool.submit`` must return an ``ObjectRef`` at once, but where the work runs is known only
once the scheduler grants it GPUs. So the driver calls this actor (async, ``num_cpus=0``, on
the driver's node, owned by the driver): its ``run`` waits for the grant without holding any
process, launches the function there with ``num_gpus=0`` and a hard node affinity, awaits it
and returns its result, which is what the driver's ``ObjectRef`` resolves to. Because this
actor owns the work, it sees every way the work ends (a result, an exception, a dead worker, a
lost node) and releases the lease then, exactly once. Because the driver owns this actor, Ray
ends it, and the work it launched, when the driver goes, and the scheduler, which watches
it, withdraws what it waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ray.exceptions import NodeDiedError, RayActorError, TaskUnschedulableError

from .._core._demand import make_demand
from .._core._scheduler import Demand
from . import _api
from ._state import Key, MemoryDemand, Placement
from ._turns import PATIENCE_S, Turns
from ._worker import (
    WATCH_GROUP,
    bound_leased,
    device_env,
    leased_class,
    run_leased,
    task_name,
)

__all__ = ["Call", "ClientActor", "Grant", "Launchers", "Lent", "Op", "TaskOptions"]

Op = tuple[Any, ...]
"""One entry of a batch to the scheduler: ``("request", number, count, units, memory)``,
``("release", number, node_lost)`` or ``("cancel", number)``."""
Lent = tuple[int, Demand, Placement]
"""A kept lease lent to the driver (see :meth:`ClientActor.lend`): its number, its demand and
where it is."""
Grant = tuple[int, Placement | None, str | None]
"""The scheduler's answer to a request: ``(number, placement, None)`` or ``(number, None,
reason)``."""

SCHEDULER_RETRY_S = 120.0
"""How long the driver keeps asking a scheduler that is restarting (or gone) before failing."""
RETRY_PAUSE_S = 0.2
CANCEL_WAIT_S = 30.0
ORDER_WAIT_S = PATIENCE_S
"""How long a call waits for an earlier one of the driver's to arrive (see ``_turns``)."""
LAUNCH_ATTEMPTS = 3
"""Grants a task may get on nodes that die before it starts there, before it fails."""
LAUNCHERS = 1024
"""Remote functions with options kept for reuse (function name, options, node) at most."""
KEEP_S = 0.2
"""How long a client keeps the lease of a finished task for the next task of the same demand,
while the scheduler lets it (nobody waits); 0 gives every lease back at once."""

_run_fresh = _api.remote(run_leased, max_calls=1)
_run_reusing = _api.remote(run_leased)


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How leased work is launched: CPUs reserved through Ray; whether a worker process may
    serve several leases on the same GPUs (``reuse_worker``, the default; ``False`` gives each
    task a fresh process); and whether it may serve leases on other GPUs than its first
    (``reuse_across_gpus``, only for work that never initialises CUDA: CUDA reads
    ``CUDA_VISIBLE_DEVICES`` once per process). See docs/ray.md, "Worker processes"."""

    num_cpus: float = 0.0
    reuse_worker: bool = True
    reuse_across_gpus: bool = False

    @property
    def pinned(self) -> bool:
        """Whether a process that ran this work keeps the GPUs it started with."""
        return not self.reuse_across_gpus


@dataclass(frozen=True, slots=True)
class Call:
    """One call from the driver: its place in the driver's order (None from copies of the
    pool inside tasks), its demand, and how to launch it."""

    seq: int | None
    count: int
    units: int
    options: TaskOptions
    memory: bool = False  # units are MiB on one GPU (memory=)

    @property
    def demand(self) -> Demand:
        """What the call asks for, in the cluster state's words."""
        return (
            MemoryDemand(1, self.units)
            if self.memory
            else make_demand(count=self.count, units=self.units)
        )


class Launchers:
    """Launches leased tasks: ``run_leased`` with the task's options on its node, made once
    per function, options and node (Ray's ``.options()`` costs about as much as a launch).

    The function travels as the first argument, pickled with every call. With
    ``bind_repeated`` (the driver, whose functions are the same objects call after call), a
    function launched a second time gets a remote function of its own that calls it, which
    Ray ships to a worker once (as for a plain ``@ray.remote`` function): 0.3-0.8 ms less per
    task for a function defined in the driver's script. Not the first time, so that a
    function made afresh for each call is not registered with Ray for each call.
    """

    def __init__(self, *, bind_repeated: bool = False) -> None:
        self._bind_repeated = bind_repeated
        self._made: dict[tuple[object, TaskOptions, str, tuple[str, ...] | None], Any] = {}
        self._seen: dict[int, Callable[..., Any]] = {}  # functions launched once, by id
        self._bound: dict[tuple[int, bool], tuple[Callable[..., Any], Any]] = {}

    def launch(
        self,
        fn: Callable[..., Any],
        options: TaskOptions,
        placement: Placement,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Launch ``fn(*args, **kwargs)`` on ``placement``'s node and GPUs; its ``ObjectRef``.

        Pinned work (the default) carries its devices in its runtime environment: Ray gives a
        task only a worker started with the same runtime environment (its hash is part of the
        worker's key), so each worker process serves leases on one set of devices only, and
        sees them from its start."""
        gpus, devices, pinned = placement.gpus, placement.devices, options.pinned
        bound = self._bound_remote(fn, options.reuse_worker) if self._bind_repeated else None
        if bound is not None:
            launcher = self._with_options(("bound", id(fn)), bound, fn, options, placement)
            return launcher.remote(gpus, devices, pinned, *args, **kwargs)
        generic = _run_reusing if options.reuse_worker else _run_fresh
        launcher = self._with_options(task_name(fn), generic, fn, options, placement)
        return launcher.remote(fn, gpus, devices, pinned, *args, **kwargs)

    def _bound_remote(self, fn: Callable[..., Any], reuse_worker: bool) -> Any:
        """The remote function of its own for ``fn``, if it was launched before; else None."""
        key = (id(fn), reuse_worker)
        entry = self._bound.get(key)
        if entry is not None:
            return entry[1]
        if self._seen.get(id(fn)) is not fn:
            self._trim()
            self._seen[id(fn)] = fn  # kept alive here, so that its id is not reused
            return None
        self._trim()
        options = {} if reuse_worker else {"max_calls": 1}
        remote = _api.remote(bound_leased(fn), **options)
        self._bound[key] = (fn, remote)
        return remote

    def _with_options(
        self,
        key: object,
        remote: Any,
        fn: Callable[..., Any],
        options: TaskOptions,
        placement: Placement,
    ) -> Any:
        devices = placement.devices if options.pinned else None
        made_key = (key, options, placement.node_id, devices)
        launcher = self._made.get(made_key)
        if launcher is None:
            self._trim()
            pinning = {} if devices is None else {"runtime_env": _pinned_env(devices)}
            launcher = self._made[made_key] = remote.options(
                name=task_name(fn),
                num_cpus=options.num_cpus,
                num_gpus=0,
                max_retries=0,
                scheduling_strategy=_api.affinity(placement.node_id),
                **pinning,
            )
        return launcher

    def _trim(self) -> None:
        """Forget everything once LAUNCHERS of any kind are kept (bound ones are named by
        the ids of functions kept alive only here)."""
        if max(len(self._made), len(self._seen), len(self._bound)) >= LAUNCHERS:
            self._made.clear()
            self._seen.clear()
            self._bound.clear()


def _pinned_env(devices: tuple[str, ...]) -> dict[str, Any]:
    """The runtime environment of pinned work on ``devices``: their variables, set when the
    worker process starts (and so part of the key Ray picks a worker by)."""
    return {"env_vars": device_env(devices, {})}


class ClientActor:
    """Waits for grants, launches work on them and releases them (see the module)."""

    def __init__(
        self, scheduler_name: str, namespace: str, name: str, keep_s: float = KEEP_S
    ) -> None:
        self._scheduler = _api.get_actor(scheduler_name, namespace)
        self._name = name
        self._numbers = itertools.count(1)
        self._leases: dict[int, Placement] = {}
        self._waiting: dict[int, tuple[Demand, float]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._turns = Turns(ORDER_WAIT_S)
        self._sent = 0  # requests sent to the scheduler: each is numbered in the order sent
        # Kept leases (see keep_s in connect): idle ones by demand, each with its expiry; the
        # scheduler's word on keeping (granted "keep" after the last recall seen); and the
        # requests this client has on their way or waiting there (none while it reuses one).
        self._keep_s = keep_s
        self._idle: dict[Demand, dict[int, asyncio.TimerHandle]] = {}
        self._may_keep = False
        self._recalled_at = 0.0
        self._asking = 0
        # What goes to the scheduler: one batch per loop turn; the requests sent, by number.
        self._outbox: list[Op] = []
        self._asked: dict[int, asyncio.Future[Placement]] = {}
        self._me: Any = None  # this actor's handle, sent with each batch for the grants
        self._launchers = Launchers()
        # Kept leases lent to the driver (see lend): their numbers and demands; the driver's
        # pending lend call, woken when there is something to tell it; the last recall told.
        self._lent: dict[int, Demand] = {}
        self._lender: asyncio.Future[None] | None = None
        self._recall_told = 0.0

    def __repr__(self) -> str:
        # Ray shows it in the header of every error a task of this client raises.
        return f"hwpool.ray client {self._name}"

    # ----------------------------------------------------------------- for the scheduler
    async def watch(self) -> None:
        """Never returns: the scheduler learns of this client's death when Ray fails it."""
        await asyncio.Event().wait()

    async def held(self) -> tuple[list[Placement], list[tuple[Key, Demand, float]], int]:
        """The leases held, the requests waiting (with when they were made) and how many
        requests were sent, for a restarted scheduler to restore (and to order those sent
        after)."""
        waiting = [((self._name, n), d, since) for n, (d, since) in self._waiting.items()]
        return list(self._leases.values()), waiting, self._sent

    async def recall(self, since: float) -> None:
        """Someone waits (the scheduler's clock said ``since``): give back every kept lease
        now idle, and each busy one as its task ends, until a grant says keeping is fine
        again."""
        self._recalled_at = max(self._recalled_at, since)
        self._may_keep = False
        idle, self._idle = self._idle, {}
        for numbers in idle.values():
            for number, expiry in numbers.items():
                expiry.cancel()
                self._release(number)
        self._wake_lender()  # the driver gives back what it was lent

    # ----------------------------------------------------------------- for the driver
    async def run(
        self,
        call: Call,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Wait for the GPUs, run ``fn(*args, **kwargs)`` on them, release, return its result.

        If the node goes before the task could start there, the task asks for GPUs again
        (at the back of the queue); if it goes while the task runs, the task fails, as a
        Ray task without retries does.
        """
        demand, options = call.demand, call.options
        for attempt in itertools.count(1):
            number, placement = await self._acquire(demand, call.seq if attempt == 1 else None)
            node_lost = False
            try:
                ref = self._launchers.launch(fn, options, placement, args, kwargs)
                return await _outcome(ref)
            except TaskUnschedulableError:
                node_lost = True
                if attempt >= LAUNCH_ATTEMPTS:
                    raise
            except NodeDiedError:
                node_lost = True
                raise
            finally:
                # Sent before the result goes back, not awaited: the next task need not wait.
                self._finished(number, demand, node_lost)
        raise AssertionError("unreachable")  # pragma: no cover

    async def start_actor(
        self,
        call: Call,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Wait for the GPUs, start an actor of ``cls`` on them and return its handle; the
        lease lasts as long as the actor does."""
        number, placement = await self._acquire(call.demand, call.seq)
        try:
            actor_class = _api.remote(
                leased_class(cls, placement.gpus),
                concurrency_groups={WATCH_GROUP: 1},
                max_restarts=0,
            )
            handle = actor_class.options(
                num_cpus=call.options.num_cpus,
                num_gpus=0,
                scheduling_strategy=_api.affinity(placement.node_id),
                runtime_env={"env_vars": device_env(placement.devices, {})},
            ).remote(*args, **kwargs)
            watch = handle._hwpool_watch.remote()
        except BaseException:
            self._release(number)
            raise
        self._spawn(self._hold_while_alive(number, watch))
        return handle

    async def lend(self, wait_s: float | None) -> tuple[list[Lent], bool]:
        """The driver's pending call for kept leases (see ``_lending``): return, as soon as
        there is any (or after ``wait_s`` seconds; None: no limit), the idle kept leases it
        may launch tasks on itself, and whether the scheduler recalled what was kept since the
        last answer (the driver then gives back what it was lent: its idle leases at once,
        its busy ones as their tasks end). Lent leases stay this client's for the scheduler."""
        if not self._news():
            future = self._lender = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(future, wait_s)
            except TimeoutError:
                pass
            finally:
                self._lender = None
        recalled = self._recalled_at > self._recall_told
        self._recall_told = self._recalled_at
        lent: list[Lent] = []
        if self._lendable():
            idle, self._idle = self._idle, {}
            for demand, numbers in idle.items():
                for number, expiry in numbers.items():
                    expiry.cancel()
                    self._lent[number] = demand
                    lent.append((number, demand, self._leases[number]))
        return lent, recalled

    async def give_back(self, returned: list[tuple[int, bool]]) -> None:
        """The driver is done with these lent leases: ``(number, node_lost)`` each."""
        for number, node_lost in returned:
            if self._lent.pop(number, None) is not None:
                self._release(number, node_lost)

    async def skip(self, seq: int) -> None:
        """The driver's call ``seq`` was never sent (its arguments did not serialize)."""
        await self._turns.skip(seq)

    # ----------------------------------------------------------------- internals
    def _lendable(self) -> bool:
        """Whether the idle kept leases may go to the driver: the scheduler lets this client
        keep, and none of its requests is on its way or waits (the core orders those)."""
        return self._may_keep and not self._asking and any(self._idle.values())

    def _news(self) -> bool:
        """Whether the driver's lend call has something to answer now."""
        return self._recalled_at > self._recall_told or self._lendable()

    def _wake_lender(self) -> None:
        lender = self._lender
        if lender is not None and not lender.done() and self._news():
            lender.set_result(None)

    async def _acquire(self, demand: Demand, seq: int | None) -> tuple[int, Placement]:
        """A lease for ``demand``, in the driver's order: a kept one if the scheduler lets
        this client keep and it asks for nothing else, else a new one; its number and where."""
        number = next(self._numbers)
        if seq is not None:  # in the driver's order (copies of the pool have none)
            await self._turns.wait(seq)
        # Waiting from its turn on, so that a restarted scheduler, which queues what clients
        # wait for by when it was asked, restores a driver's requests in the driver's order
        # (Ray may start its calls in another); one not yet through its turn was not sent.
        self._waiting[number] = (demand, time.time())
        try:
            kept = self._take_kept(demand)
            if kept is not None:
                return kept, self._leases[kept]
            placement = await self._request(number, demand)
        finally:
            del self._waiting[number]
        self._leases[number] = placement
        return number, placement

    def _take_kept(self, demand: Demand) -> int | None:
        """An idle kept lease of ``demand`` (its expiry cancelled), or None. None too while
        one of this client's requests is on its way or waits: the core orders those."""
        idle = self._idle.get(demand)
        if not idle or not self._may_keep or self._asking:
            return None
        number, expiry = idle.popitem()
        expiry.cancel()
        return number

    def _finished(self, number: int, demand: Demand, node_lost: bool) -> None:
        """A task ended on lease ``number``: keep the lease for the next task of ``demand``
        (for ``keep_s``) if the scheduler lets this client keep and nothing of it waits
        there; else give it back."""
        if node_lost or not self._may_keep or self._asking or number not in self._leases:
            self._release(number, node_lost)
            return
        loop = asyncio.get_running_loop()
        expiry = loop.call_later(self._keep_s, self._expire, number, demand)
        self._idle.setdefault(demand, {})[number] = expiry
        self._wake_lender()

    def _expire(self, number: int, demand: Demand) -> None:
        """Kept lease ``number`` waited ``keep_s`` for a task in vain: give it back."""
        idle = self._idle.get(demand, {})
        if idle.pop(number, None) is not None:
            self._release(number)

    def _granted(self, keep_since: float | None) -> None:
        """What a grant says about keeping: allowed since the scheduler's ``keep_since``
        (unless a later recall came first), or not (someone waited)."""
        if keep_since is None:
            self._may_keep = False
        elif keep_since > self._recalled_at and self._keep_s > 0:
            self._may_keep = True

    async def _request(self, number: int, demand: Demand) -> Placement:
        """Queue the request in the next batch to the scheduler and wait for its grant, which
        the scheduler pushes (:meth:`granted`). A request in a batch lost to a scheduler
        restart is not sent again: the restarted scheduler restores it from :meth:`held`."""
        future = asyncio.get_running_loop().create_future()
        self._asked[number] = future
        memory = isinstance(demand, MemoryDemand)
        self._send(("request", number, demand.count, demand.units, memory))
        self._asking += 1
        try:
            placement: Placement = await future
        except asyncio.CancelledError:  # withdrawn (released there if granted meanwhile)
            self._asked.pop(number, None)
            self._send(("cancel", number))
            raise
        finally:
            self._asking -= 1
            if not self._asking:
                self._wake_lender()  # its idle kept leases may go to the driver now
        return placement

    async def granted(self, grants: list[Grant], keep_since: float | None) -> None:
        """The scheduler's answers to requests: ``(number, placement, None)`` for a grant,
        ``(number, None, reason)`` for a request no node can hold any more; ``keep_since``
        says whether this client may keep leases (see :meth:`_granted`). A grant that nobody
        waits for here any more (its call was cancelled) goes back at once."""
        for number, placement, reason in grants:
            future = self._asked.pop(number, None)
            if future is None or future.done():
                if placement is not None:
                    self._send(("release", number, False))
            elif placement is None:
                future.set_exception(ValueError(reason))
            else:
                future.set_result(placement)
        self._granted(keep_since)

    def _release(self, number: int, node_lost: bool = False) -> None:
        # A release lost to a scheduler restart is not reclaimed either: nothing leaks.
        if self._leases.pop(number, None) is not None:
            self._send(("release", number, node_lost))

    def _send(self, op: Op) -> None:
        """Add ``op`` to the batch sent to the scheduler at the end of this loop turn."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(op)

    def _flush(self) -> None:
        """Send this loop turn's requests, releases and cancels, in their order, as one call
        numbered in the order sent (the scheduler, an async actor that Ray may start in
        another order, applies this client's batches in that order). Not awaited."""
        ops, self._outbox = self._outbox, []
        if ops:
            if self._me is None:
                self._me = _api.current_actor()
            self._sent += 1
            self._spawn(
                self._confirm(self._scheduler.submit.remote(self._name, self._sent, ops, self._me))
            )

    async def _confirm(self, ref: Any) -> None:
        """Wait for a batch to be applied. One lost to a scheduler restart is not sent again:
        the scheduler is called until it answers, and, restarted, it restores from
        :meth:`held` what this client waits for and holds (a release it never saw frees
        nothing in use, a cancel it never saw left nothing to restore). Without that call a
        restarted scheduler that nobody else calls would never start."""
        try:
            await ref
        except RayActorError:
            deadline = time.monotonic() + SCHEDULER_RETRY_S
            while time.monotonic() < deadline:
                try:
                    await self._scheduler.ready.remote()
                    return
                except RayActorError:
                    await asyncio.sleep(RETRY_PAUSE_S)

    async def _hold_while_alive(self, number: int, watch: Any) -> None:
        try:
            await watch
        except BaseException:  # the actor died (killed, crashed, exited, node lost)
            pass
        finally:
            self._release(number, True)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _outcome(ref: Any) -> Any:
    """The result of the leased task; if this call is cancelled, the task is killed first and
    awaited, so that its GPUs are given back only once nothing runs on them. A task that has
    ended is not cancelled: in Ray 2.x a cancel that crosses a task's last reply can end the
    process that owns it (ray-project/ray#54527), here this client with all it runs."""
    try:
        return await ref
    except asyncio.CancelledError:
        _, running = _api.wait([ref], num_returns=1, timeout=0)
        if running:
            _api.cancel(ref, force=True)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(_settled(ref), CANCEL_WAIT_S)
        raise


async def _settled(ref: Any) -> None:
    with contextlib.suppress(Exception):
        await ref
