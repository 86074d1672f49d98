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

from ray.exceptions import NodeDiedError, RayActorError, RayError, TaskUnschedulableError

from .._core._scheduler import Demand
from . import _api
from ._state import Key, Placement
from ._turns import PATIENCE_S, Turns
from ._worker import WATCH_GROUP, device_env, leased_class, run_leased, task_name

__all__ = ["Call", "ClientActor", "TaskOptions"]

SCHEDULER_RETRY_S = 120.0
"""How long a request keeps asking a scheduler that is restarting (or gone) before failing."""
RETRY_PAUSE_S = 0.2
CANCEL_WAIT_S = 30.0
ORDER_WAIT_S = PATIENCE_S
"""How long a call waits for an earlier one of the driver's to arrive (see ``_turns``)."""
LAUNCH_ATTEMPTS = 3
"""Grants a task may get on nodes that die before it starts there, before it fails."""

_run_fresh = _api.remote(run_leased, max_calls=1)
_run_reusing = _api.remote(run_leased)


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How leased work is launched: CPUs reserved through Ray, and whether a worker process
    may serve several leases (CUDA reads ``CUDA_VISIBLE_DEVICES`` once, so by default each
    task gets a fresh process, as Ray does for its own GPU tasks)."""

    num_cpus: float = 0.0
    reuse_worker: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """One call from the driver: its place in the driver's order (None from copies of the
    pool inside tasks), its demand, and how to launch it."""

    seq: int | None
    count: int
    units: int
    options: TaskOptions


class ClientActor:
    """Waits for grants, launches work on them and releases them (see the module)."""

    def __init__(self, scheduler_name: str, namespace: str, name: str) -> None:
        self._scheduler = _api.get_actor(scheduler_name, namespace)
        self._name = name
        self._numbers = itertools.count(1)
        self._leases: dict[int, Placement] = {}
        self._waiting: dict[int, tuple[Demand, float]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._turns = Turns(ORDER_WAIT_S)
        self._sent = 0  # requests sent to the scheduler: each is numbered in the order sent

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
        demand, options = Demand(call.count, call.units), call.options
        for attempt in itertools.count(1):
            number = next(self._numbers)
            placement = await self._acquire(number, demand, call.seq if attempt == 1 else None)
            node_lost = False
            try:
                remote = _run_reusing if options.reuse_worker else _run_fresh
                ref = remote.options(
                    name=task_name(fn),
                    num_cpus=options.num_cpus,
                    num_gpus=0,
                    max_retries=0,
                    scheduling_strategy=_api.affinity(placement.node_id),
                ).remote(fn, placement.gpus, placement.devices, *args, **kwargs)
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
                self._release(number, node_lost)
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
        number = next(self._numbers)
        placement = await self._acquire(number, Demand(call.count, call.units), call.seq)
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

    async def skip(self, seq: int) -> None:
        """The driver's call ``seq`` was never sent (its arguments did not serialize)."""
        await self._turns.skip(seq)

    # ----------------------------------------------------------------- internals
    async def _acquire(self, number: int, demand: Demand, seq: int | None) -> Placement:
        self._waiting[number] = (demand, time.time())
        try:
            if seq is not None:  # in the driver's order (copies of the pool have none)
                await self._turns.wait(seq)
            placement = await self._request(number, demand)
        finally:
            del self._waiting[number]
        self._leases[number] = placement
        return placement

    async def _request(self, number: int, demand: Demand) -> Placement:
        """Ask the scheduler, again while it restarts (the request is idempotent there).

        Each send is numbered in the order sent, so that the scheduler (an async actor, which
        Ray may start in another order) queues this client's requests in that order.
        """
        deadline = time.monotonic() + SCHEDULER_RETRY_S
        while True:
            self._sent += 1
            ref = self._scheduler.request.remote(
                self._name, number, demand.count, demand.units, self._sent
            )
            try:
                placement: Placement = await ref
            except asyncio.CancelledError:
                self._spawn(self._call(self._scheduler.cancel, number))
                self._spawn(self._give_back_if_granted(ref, number))
                raise
            except RayActorError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            return placement

    async def _give_back_if_granted(self, ref: Any, number: int) -> None:
        """A request cancelled here may still be granted there: give that grant back."""
        with contextlib.suppress(Exception):
            await ref
            await self._call(self._scheduler.release, number)

    def _release(self, number: int, node_lost: bool = False) -> None:
        if self._leases.pop(number, None) is not None:
            self._spawn(self._call(self._scheduler.release, number, node_lost))

    async def _call(self, method: Any, number: int, *more: Any) -> None:
        # A release lost to a scheduler restart is not reclaimed either: nothing leaks.
        with contextlib.suppress(RayError):
            await method.remote(self._name, number, *more)

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
    awaited, so that its GPUs are given back only once nothing runs on them."""
    try:
        return await ref
    except asyncio.CancelledError:
        _api.cancel(ref, force=True)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(_settled(ref), CANCEL_WAIT_S)
        raise


async def _settled(ref: Any) -> None:
    with contextlib.suppress(Exception):
        await ref
