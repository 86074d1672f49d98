"""The scheduler actor: one per cluster and namespace, named and detached; it alone decides GPUs.

It is one more front over the pure core (through :class:`ClusterState`), driven from its own
asyncio loop: every state change happens between two awaits, so no lock is needed. What it
learns from Ray:

- **Nodes**, from ``ray.nodes()`` (every ``poll_s`` seconds, and on ``sync_nodes``): a node with
  ``GPU`` resources joins once a probe task on it has said what its GPUs are; a node that is
  dead or gone leaves, and its leases with it.
- **Clients** (one actor per driver, see ``_client``): each has a ``watch`` call pending here
  that Ray fails when the client dies (its driver exited or crashed, its node was lost). Its
  waiting requests are then withdrawn and its leases released: Ray kills the work a dead
  owner started.
- **A restart** (the actor is restartable; it may also be killed): it starts empty, asks every
  client still alive (found by name) what it holds and what it waits for, restores that, and
  only then serves requests, so nothing is granted twice.

**Kept leases.** A grant made while nothing waits says so (the time it was made): its client
may then keep a lease whose task ended, for its next task of the same demand, without asking
here (a stream of equal tasks costs no message to this actor). As soon as a request has to
wait, every client told it may keep is recalled (``ClientActor.recall``): it gives back its
idle kept leases at once and each busy one when its task ends. The core still makes every
decision: a kept lease is a lease it granted and has not seen released, and the queue waits
for it at most one task's length, as it waits for any lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from .._core._demand import make_demand
from .._core._scheduler import Demand
from . import _api
from ._client import Grant, Op
from ._state import ClusterSnapshot, ClusterState, Key, MemoryDemand, NodeGPU, Outcome, Placement
from ._turns import Turns
from ._worker import probe_node

__all__ = ["CLIENT_PREFIX", "SCHEDULER_NAME", "SchedulerActor"]

SCHEDULER_NAME = "hwpool-scheduler"
CLIENT_PREFIX = "hwpool-client-"
POLL_S = 1.0
PROBE_TIMEOUT_S = 60.0
RECLAIM_TIMEOUT_S = 10.0
RECLAIM_TRIES = 3
_TOMBSTONES = 10_000  # cancelled keys remembered, for a request that arrives after its cancel
SIZE_RESOURCE = "hwpool_gpu_mib"
"""A node resource giving the memory of each of the node's GPUs in MiB, for GPUs whose memory
the node probe cannot read (logical GPUs, nodes without nvidia-smi)."""

log = logging.getLogger("hwpool.ray")

_probe = _api.remote(probe_node, num_cpus=0, num_gpus=0, max_retries=0)


class SchedulerActor:
    """Owns the cluster's :class:`ClusterState`; clients ask it for GPUs and give them back."""

    def __init__(self, namespace: str, poll_s: float = POLL_S) -> None:
        self._namespace = namespace
        self._poll_s = poll_s
        self._state = ClusterState()
        self._cancelled: dict[Key, None] = {}
        self._watched: set[str] = set()
        self._orders: dict[str, Turns] = {}  # per client: its requests in the order it sent them
        self._started: asyncio.Task[None] | None = None
        self._syncing: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._keepers: set[str] = set()  # clients told they may keep leases, not yet recalled
        self._handles: dict[str, Any] = {}  # clients watched: their actor handles
        self._outbox: dict[str, list[Grant]] = {}  # grants to push, per client, this turn

    # ----------------------------------------------------------------- for clients
    async def ready(self) -> None:
        """Return once the nodes are known and the clients' leases reclaimed."""
        await self._ready()

    def _keep_since(self, client: str) -> float | None:
        """Now, if nothing waits (``client`` may keep its leases, until recalled); else None."""
        if self._state.waiting():
            return None
        self._keepers.add(client)
        return time.time()

    def _recall(self) -> None:
        """Tell every client that may keep leases to give them back (a request waits)."""
        if not self._keepers:
            return
        since = time.time()
        for client in self._keepers:
            self._spawn(self._send_recall(client, since))
        self._keepers.clear()

    async def _send_recall(self, client: str, since: float) -> None:
        handle: Any = self._handles.get(client)
        try:
            if handle is None:
                handle = await asyncio.to_thread(_api.get_actor, client, self._namespace)
            await handle.recall.remote(since)
        except Exception:  # gone: what it kept is dropped when its watch fails
            log.debug("recalling the leases of %s failed", client, exc_info=True)

    async def submit(self, client: str, sent: int, ops: list[Op], handle: Any) -> None:
        """Apply a batch of ``client``'s requests, releases and cancels, in their order.

        ``sent`` numbers the client's batches (1, 2, ...): each waits here for the batches
        before it, and nothing awaits from there until the whole batch is applied, so a
        client's requests join the queue in the order it made them. Grants are pushed to
        ``handle`` (``ClientActor.granted``), a batch of them per loop turn; a request that
        no node could ever hold is answered with the reason. A release after a node died
        (``node_lost``) reads the nodes first, so that the dead node's GPUs are withdrawn
        rather than granted again.
        """
        await self._ready()
        self._handles.setdefault(client, handle)
        if any(op[0] == "release" and op[2] for op in ops):
            await self._sync_nodes()
        await self._order_of(client).wait(sent)
        self._watch(client)
        waits = False
        for op in ops:
            key = (client, op[1])
            if op[0] == "request":
                waits = self._queue(key, _demand(op[2], op[3], op[4])) or waits
            elif op[0] == "release":
                self._apply(self._state.release(key, now=time.monotonic()))
            else:
                self._withdraw(key)
        if waits:  # someone waits: no lease may be kept any longer
            self._recall()

    def _queue(self, key: Key, demand: Demand) -> bool:
        """Queue a pushed request (answered at once if it is granted or fails); whether it
        waits. One known already (restored after a restart) is not queued twice."""
        placement = self._state.lease(key)
        if placement is not None:
            self._push(key, placement, None)
            return False
        if self._state.is_waiting(key) or key in self._cancelled:
            return self._state.is_waiting(key)
        try:
            out = self._state.request(key, demand, now=time.monotonic())
        except ValueError as exc:
            self._push(key, None, str(exc))
            return False
        self._apply(out)
        return self._state.is_waiting(key)

    def _push(self, key: Key, placement: Placement | None, reason: str | None) -> None:
        """Answer request ``key`` with the next batch of grants to its client."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush_grants)
        self._outbox.setdefault(key[0], []).append((key[1], placement, reason))

    def _flush_grants(self) -> None:
        """Send each client its grants of this loop turn in one call, saying whether it may
        keep leases (nothing waits) or not."""
        outbox, self._outbox = self._outbox, {}
        for client, grants in outbox.items():
            keep = self._keep_since(client)
            handle = self._handles.get(client)
            if handle is not None:
                handle.granted.remote(grants, keep)
            else:  # pragma: no cover - a client that pushed nothing yet (restored)
                self._spawn(self._send_grants(client, grants, keep))

    async def _send_grants(self, client: str, grants: list[Grant], keep: float | None) -> None:
        try:
            handle = await asyncio.to_thread(_api.get_actor, client, self._namespace)
            self._handles[client] = handle
            await handle.granted.remote(grants, keep)
        except Exception:  # gone: its watch withdraws what it had
            log.debug("pushing grants to %s failed", client, exc_info=True)

    def _order_of(self, client: str) -> Turns:
        turns = self._orders.get(client)
        if turns is None:
            turns = self._orders[client] = Turns()
        return turns

    def _withdraw(self, key: Key) -> None:
        if self._state.lease(key) is None and not self._state.is_waiting(key):
            self._cancelled[key] = None  # it may still be on its way
            while len(self._cancelled) > _TOMBSTONES:
                del self._cancelled[next(iter(self._cancelled))]
        self._apply(self._state.cancel(key, now=time.monotonic()))

    async def snapshot(self) -> ClusterSnapshot:
        """Nodes and free capacity, leases, and the queue in order."""
        await self._ready()
        return self._state.snapshot()

    async def sync_nodes(self) -> ClusterSnapshot:
        """Read the cluster's nodes now (rather than at the next poll); then snapshot."""
        await self._ready()
        await self._sync_nodes()
        return self._state.snapshot()

    # ----------------------------------------------------------------- start
    async def _ready(self) -> None:
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        await self._sync_nodes()
        await self._reclaim()
        self._spawn(self._poll())

    async def _reclaim(self) -> None:
        """Restore what the live clients hold and wait for (empty on a first start)."""
        named = await asyncio.to_thread(_api.named_actors)
        names = [
            actor["name"]
            for actor in named
            if isinstance(actor, dict)
            and actor.get("namespace") == self._namespace
            and str(actor.get("name", "")).startswith(CLIENT_PREFIX)
        ]
        answers = await asyncio.gather(*(self._held(name) for name in names))
        leases: list[Placement] = []
        waiting: list[tuple[float, Key, Demand]] = []
        for name, answer in zip(names, answers, strict=True):
            if answer is None:
                continue
            held, asked, sent = answer
            leases += held
            waiting += [(since, key, demand) for key, demand, since in asked]
            self._orders[name] = Turns(first=sent + 1)  # sends up to there: restored or retried
            self._keepers.add(name)  # it may have been told it may keep: recall it when need be
            self._watch(name)
        waiting.sort(key=lambda item: item[0])
        if leases or waiting:
            log.info("reclaimed %d leases and %d waiters", len(leases), len(waiting))
        queued = [(key, d) for _, key, d in waiting]
        self._apply(self._state.restore(leases, queued, now=time.monotonic()))

    async def _held(
        self, name: str
    ) -> tuple[list[Placement], list[tuple[Key, Demand, float]], int] | None:
        """What client ``name`` holds and waits for; None if it is gone.

        A client that is alive but does not answer (``RECLAIM_TRIES`` times) is ended: what it
        runs could not be restored, and must not overlap what is granted next.
        """
        try:
            handle = await asyncio.to_thread(_api.get_actor, name, self._namespace)
        except Exception:  # gone: whatever it held ended with it
            return None
        self._handles[name] = handle
        for _ in range(RECLAIM_TRIES):
            try:
                held: tuple[list[Placement], list[tuple[Key, Demand, float]], int]
                held = await asyncio.wait_for(handle.held.remote(), RECLAIM_TIMEOUT_S)
            except TimeoutError:
                continue
            except Exception:  # it died meanwhile
                return None
            return held
        log.warning("client %s did not say what it holds: ending it", name)
        _api.kill(handle)
        return None

    # ----------------------------------------------------------------- nodes
    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await self._sync_nodes()
            except Exception:  # pragma: no cover - a GCS hiccup: try again next time
                log.exception("reading the cluster's nodes failed")

    async def _sync_nodes(self) -> None:
        if self._syncing is None:
            self._syncing = asyncio.Lock()
        async with self._syncing:
            listed = await asyncio.to_thread(_api.nodes)
            resources = {
                str(node["NodeID"]): node.get("Resources", {})
                for node in listed
                if node.get("Alive")
            }
            alive = {node: int(r.get("GPU", 0)) for node, r in resources.items()}
            alive = {node: count for node, count in alive.items() if count > 0}
            known = self._state.nodes
            for node, node_gpus in known.items():
                if alive.get(node) != len(node_gpus):
                    log.info("node %s left with %d GPUs", node, len(node_gpus))
                    self._apply(self._state.remove_node(node, now=time.monotonic()))
            joining = [node for node in alive if node not in self._state.nodes]
            probed = await asyncio.gather(
                *(
                    self._probe(node, alive[node], resources[node].get(SIZE_RESOURCE))
                    for node in joining
                )
            )
            for node, node_gpus in zip(joining, probed, strict=True):
                log.info("node %s joined with %d GPUs", node, len(node_gpus))
                self._apply(self._state.add_node(node, node_gpus, now=time.monotonic()))

    async def _probe(self, node: str, count: int, size: object = None) -> tuple[NodeGPU, ...]:
        """Ask the node what its GPUs are; plain indices if it cannot say. ``size``: the
        node's ``hwpool_gpu_mib`` resource, the memory of each GPU whose memory the probe did
        not find."""
        ref = _probe.options(scheduling_strategy=_api.affinity(node)).remote(count)
        try:
            gpus: tuple[NodeGPU, ...] = await asyncio.wait_for(ref, PROBE_TIMEOUT_S)
        except Exception:
            log.warning("node %s did not say what its GPUs are; using indices", node)
            _api.cancel(ref, force=True)
            gpus = tuple(NodeGPU(i, str(i)) for i in range(count))
        return _sized(gpus, size)

    # ----------------------------------------------------------------- clients
    def _watch(self, client: str) -> None:
        if client not in self._watched:
            self._watched.add(client)
            self._spawn(self._watch_client(client))

    async def _watch_client(self, client: str) -> None:
        """Wait for ``client`` to die, then withdraw and release everything it had."""
        try:
            handle = await asyncio.to_thread(_api.get_actor, client, self._namespace)
            self._handles[client] = handle
            await handle.watch.remote()
        except Exception:
            pass
        self._watched.discard(client)
        self._handles.pop(client, None)
        self._outbox.pop(client, None)
        self._keepers.discard(client)
        self._orders.pop(client, None)
        log.info("client %s is gone: withdrawing its requests and leases", client)
        self._apply(self._state.drop_client(client, now=time.monotonic()))

    # ----------------------------------------------------------------- outcomes
    def _apply(self, out: Outcome) -> None:
        """Wake the requests placed, fail those that can never be placed, log lost leases."""
        for placement in out.placed:
            self._push(placement.key, placement, None)
        for key, reason in out.failed:
            self._push(key, None, reason)
        for placement in out.lost:
            log.warning("lease %s lost with node %s", placement.key, placement.node_id)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _demand(count: int, units: int, memory: bool) -> Demand:
    """A client's request as the cluster state takes it (MiB on one GPU if ``memory``)."""
    return MemoryDemand(count, units) if memory else make_demand(count=count, units=units)


def _sized(gpus: tuple[NodeGPU, ...], size: object) -> tuple[NodeGPU, ...]:
    """``gpus`` with ``size`` MiB (a node resource, a whole positive number) as the memory of
    each whose memory is unknown; as they are if ``size`` is not such a number."""
    if not isinstance(size, int | float) or size < 1 or size != int(size):
        if size is not None:
            log.warning("%s=%r is not a whole number of MiB: ignored", SIZE_RESOURCE, size)
        return gpus
    return tuple(
        gpu
        if gpu.memory_mib is not None
        else NodeGPU(gpu.index, gpu.device_id, gpu.uuid, int(size))
        for gpu in gpus
    )
