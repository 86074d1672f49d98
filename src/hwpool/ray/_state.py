"""The GPUs of a Ray cluster as one scheduler core: what the scheduler actor decides with.

Pure (no Ray, no I/O, no clock), so that every rule here is tested without a cluster. Every GPU
of every node is one logical GPU of a single :class:`hwpool._core._scheduler.Scheduler`, so a
request anywhere in the cluster waits in one FIFO queue with the core's reservations, best fit
and backfill; this module adds only what a cluster has and one host has not:

- **Nodes come and go.** Adding or removing a node rebuilds the core over the GPUs now present:
  the leases still held are restored on their GPUs, then the waiting requests are submitted
  again in their queue order. The leases of a removed node are dropped without being released
  (their GPUs are gone, so nothing is freed twice); a waiting request that no node can hold
  any more fails.
- **A multi-GPU lease must sit on one node** (a Ray task is one process). Each node is a
  group of the core (rule 12 of :mod:`hwpool._core._scheduler`), so the core places a
  multi-GPU request on GPUs of one node and, at the head of the queue, reserves GPUs of one
  node: those whose work is expected to end first. Nothing new is placed there, so the
  request starts once that work ends, as on one machine.

Invariants after every call: on every GPU the units of its leases plus its free units in the
core equal one GPU; a request is waiting, leased or gone; every lease lies on one node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .._core._capacity import UNITS_PER_GPU, units_to_fraction
from .._core._scheduler import Demand, Grant, Scheduler

__all__ = [
    "ClusterSnapshot",
    "ClusterState",
    "Key",
    "LeaseSnapshot",
    "NodeGPU",
    "NodeSnapshot",
    "Outcome",
    "Placement",
    "WaitingSnapshot",
    "asked",
    "infeasible",
]

Key = tuple[str, int]
"""A request's identity: the name of the client that asked and its number there."""


@dataclass(frozen=True, slots=True)
class NodeGPU:
    """One GPU of a node: its index there, what selects it in ``CUDA_VISIBLE_DEVICES``
    (a UUID where the node knows it, else the index), and its memory where known."""

    index: int
    device_id: str
    uuid: str | None = None
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """A granted request: ``units`` on each of the GPUs ``gpus`` (indices on ``node_id``)."""

    key: Key
    node_id: str
    gpus: tuple[int, ...]
    devices: tuple[str, ...]
    units: int


@dataclass(slots=True)
class Outcome:
    """What one input changed: requests ``placed``, requests ``failed`` (with the reason) and
    leases ``lost`` with their node."""

    placed: list[Placement] = field(default_factory=list)
    failed: list[tuple[Key, str]] = field(default_factory=list)
    lost: list[Placement] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """A node's GPUs and the free fraction of each."""

    node_id: str
    gpus: tuple[NodeGPU, ...]
    free: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class LeaseSnapshot:
    """A held lease: whose (``client``, ``request``), where, and the share of each GPU."""

    client: str
    request: int
    node_id: str
    gpus: tuple[int, ...]
    fraction: float


@dataclass(frozen=True, slots=True)
class WaitingSnapshot:
    """A waiting request, in queue order: ``count`` GPUs of ``fraction`` each."""

    client: str
    request: int
    count: int
    fraction: float


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The cluster as the scheduler sees it: nodes, leases, and the queue in order."""

    nodes: tuple[NodeSnapshot, ...]
    leases: tuple[LeaseSnapshot, ...]
    waiting: tuple[WaitingSnapshot, ...]

    @property
    def num_gpus(self) -> int:
        """How many GPUs the cluster has."""
        return sum(len(node.gpus) for node in self.nodes)

    @property
    def largest_node(self) -> int:
        """The GPUs of the node with the most (0 without GPU nodes)."""
        return max((len(node.gpus) for node in self.nodes), default=0)


def asked(demand: Demand) -> str:
    """``demand`` as the user asked for it: ``fraction=0.25``, ``one GPU`` or ``gpus=2``."""
    if demand.count > 1:
        return f"gpus={demand.count}"
    if demand.units < UNITS_PER_GPU:
        return f"fraction={units_to_fraction(demand.units):g}"
    return "one GPU"


def infeasible(demand: Demand, largest: int) -> str | None:
    """Why no node of a cluster whose largest node has ``largest`` GPUs could ever hold
    ``demand`` (naming the demand and what to do), or None if one could."""
    if largest == 0:
        return (
            f"{asked(demand)} cannot be granted: the Ray cluster has no GPUs; on a machine "
            "without GPUs, start Ray with logical ones: ray.init(num_gpus=N) "
            "(or ray start --num-gpus=N on each node)"
        )
    if demand.count > largest:
        return (
            f"gpus={demand.count} is more than any node of the cluster has "
            f"(the largest has {largest})"
        )
    return None


class ClusterState:
    """Requests, leases and nodes of one cluster over one scheduler core (see the module)."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[NodeGPU, ...]] = {}
        self._labels: list[tuple[str, int]] = []  # logical GPU -> (node, index there)
        self._logical: dict[tuple[str, int], int] = {}
        self._core: Scheduler | None = None
        self._leases: dict[Key, Placement] = {}
        self._demands: dict[Key, Demand] = {}  # requests not placed yet
        self._tickets: dict[int, Key] = {}  # core ticket -> waiting request
        self._ticket_of: dict[Key, int] = {}
        self._now: float | None = None  # the time of the input being handled

    # ----------------------------------------------------------------- queries
    @property
    def nodes(self) -> dict[str, tuple[NodeGPU, ...]]:
        """The GPU nodes, in the order they joined."""
        return dict(self._nodes)

    @property
    def largest_node(self) -> int:
        """The GPUs of the node with the most (0 without GPU nodes)."""
        return max((len(gpus) for gpus in self._nodes.values()), default=0)

    def lease(self, key: Key) -> Placement | None:
        """The lease of ``key``, if it holds one."""
        return self._leases.get(key)

    def leases(self) -> list[Placement]:
        """Every lease held."""
        return list(self._leases.values())

    def is_waiting(self, key: Key) -> bool:
        """Whether ``key`` waits in the queue."""
        return key in self._demands

    def waiting(self) -> list[tuple[Key, Demand]]:
        """The waiting requests in queue order."""
        if self._core is None:
            return []
        return [
            (self._tickets[w.ticket], self._demands[self._tickets[w.ticket]])
            for w in self._core.waiters()
        ]

    def reserved(self) -> list[tuple[str, int]]:
        """The GPUs the head of the queue reserves, as ``(node, index)``."""
        if self._core is None:
            return []
        return [self._labels[g] for gpus in self._core.reservations().values() for g in gpus]

    def free_units(self, node_id: str, index: int) -> int:
        """Free units of one GPU in the core."""
        assert self._core is not None
        return self._core.free[self._logical[node_id, index]]

    def snapshot(self) -> ClusterSnapshot:
        """Nodes with free capacity per GPU, the leases, and the queue in order."""
        nodes = tuple(
            NodeSnapshot(
                node,
                gpus,
                tuple(units_to_fraction(self.free_units(node, g.index)) for g in gpus),
            )
            for node, gpus in self._nodes.items()
        )
        leases = tuple(
            LeaseSnapshot(p.key[0], p.key[1], p.node_id, p.gpus, units_to_fraction(p.units))
            for p in self._leases.values()
        )
        waiting = tuple(
            WaitingSnapshot(key[0], key[1], d.count, units_to_fraction(d.units))
            for key, d in self.waiting()
        )
        return ClusterSnapshot(nodes, leases, waiting)

    def infeasible(self, demand: Demand) -> str | None:
        """Why no node of the cluster could ever hold ``demand``, or None if one could."""
        return infeasible(demand, self.largest_node)

    # ----------------------------------------------------------------- inputs
    def request(self, key: Key, demand: Demand, *, now: float | None = None) -> Outcome:
        """Queue ``demand`` for ``key`` (granted at once if it fits).

        Raises ValueError, changing nothing, if ``key`` is known already or no node could ever
        hold the demand. ``now`` (on every input) is the caller's clock, for a core that takes
        it.
        """
        self._now = now
        if key in self._leases or key in self._demands:
            raise ValueError(f"request {key!r} is already known")
        reason = self.infeasible(demand)
        if reason is not None:
            raise ValueError(reason)
        out = Outcome()
        self._absorb(self._submit(key, demand), out)
        return out

    def release(self, key: Key, *, now: float | None = None) -> Outcome:
        """Give back the lease of ``key``; a key without one (released already, lost with its
        node, never granted) changes nothing."""
        self._now = now
        out = Outcome()
        placement = self._leases.pop(key, None)
        if placement is not None:
            assert self._core is not None
            pairs = [(self._logical[placement.node_id, g], placement.units) for g in placement.gpus]
            self._absorb(self._core.release_many(pairs, now=self._now), out)
        return out

    def cancel(self, key: Key, *, now: float | None = None) -> Outcome:
        """Withdraw ``key``: a waiting request leaves the queue, a lease is released."""
        if key in self._leases:
            return self.release(key, now=now)
        self._now = now
        out = Outcome()
        if key in self._ticket_of:
            assert self._core is not None
            ticket = self._ticket_of.pop(key)
            del self._tickets[ticket], self._demands[key]
            self._absorb(self._core.cancel(ticket, now=self._now), out)
        return out

    def drop_client(self, client: str, *, now: float | None = None) -> Outcome:
        """Withdraw every request and release every lease of ``client`` (it has gone)."""
        out = Outcome()
        keys = [k for k in (*self._demands, *self._leases) if k[0] == client]
        for key in keys:
            step = self.cancel(key, now=now)
            out.placed += step.placed
            out.failed += step.failed
        return out

    def add_node(
        self, node_id: str, gpus: Iterable[NodeGPU], *, now: float | None = None
    ) -> Outcome:
        """A node joined (or changed): rebuild the core over every GPU now present."""
        self._now = now
        nodes = dict(self._nodes)
        nodes[node_id] = tuple(gpus)
        if not nodes[node_id]:
            del nodes[node_id]
        return self._rebuild(nodes, self.leases(), self.waiting())

    def remove_node(self, node_id: str, *, now: float | None = None) -> Outcome:
        """A node left: its leases are lost (not released), the core is rebuilt without it."""
        self._now = now
        if node_id not in self._nodes:
            return Outcome()
        nodes = {n: g for n, g in self._nodes.items() if n != node_id}
        return self._rebuild(nodes, self.leases(), self.waiting())

    def restore(
        self,
        leases: Iterable[Placement],
        waiting: Iterable[tuple[Key, Demand]],
        *,
        now: float | None = None,
    ) -> Outcome:
        """Start again from what the clients still hold and wait for (a restarted actor).

        Leases that no longer fit (unknown node or GPU, or more than a GPU holds) are lost;
        waiting requests are queued in the order given.
        """
        self._now = now
        return self._rebuild(dict(self._nodes), list(leases), list(waiting))

    # ----------------------------------------------------------------- internals
    def _rebuild(
        self,
        nodes: dict[str, tuple[NodeGPU, ...]],
        leases: list[Placement],
        waiting: list[tuple[Key, Demand]],
    ) -> Outcome:
        self._nodes = nodes
        self._labels = [(node, gpu.index) for node, gpus in nodes.items() for gpu in gpus]
        self._logical = {label: i for i, label in enumerate(self._labels)}
        groups = [node for node, _ in self._labels]  # rule 12: one node's GPUs for a task
        self._core = Scheduler(len(self._labels), groups=groups) if self._labels else None
        self._leases, self._demands = {}, {}
        self._tickets, self._ticket_of = {}, {}
        out = Outcome()
        for placement in leases:
            if not self._restore_lease(placement):
                out.lost.append(placement)
        grants: list[Grant] = []
        for key, demand in waiting:
            reason = self.infeasible(demand)
            if reason is not None:
                out.failed.append((key, reason))
            elif key not in self._leases and key not in self._demands:
                grants += self._submit(key, demand)
        self._absorb(grants, out)
        return out

    def _restore_lease(self, placement: Placement) -> bool:
        """Hold ``placement`` again on its GPUs; False if it cannot be (it is then lost)."""
        if self._core is None or placement.key in self._leases:
            return False
        try:
            gpus = tuple(self._logical[placement.node_id, g] for g in placement.gpus)
            self._core.restore(gpus, placement.units)
        except (KeyError, ValueError):
            return False
        self._leases[placement.key] = placement
        return True

    def _submit(self, key: Key, demand: Demand) -> list[Grant]:
        """Queue ``demand`` in the core; its grant, if it was granted at once."""
        assert self._core is not None
        self._demands[key] = demand
        ticket, grant = self._core.submit(demand, now=self._now)
        self._tickets[ticket] = key
        self._ticket_of[key] = ticket
        return [] if grant is None else [grant]

    def _absorb(self, grants: list[Grant], out: Outcome) -> None:
        """Turn the core's grants into placements."""
        for grant in grants:
            key = self._tickets.pop(grant.ticket)
            del self._ticket_of[key]
            out.placed.append(self._place(key, grant.gpus, grant.units))

    def _place(self, key: Key, logical: Iterable[int], units: int) -> Placement:
        """The lease of ``key`` on the logical GPUs ``logical``, all on one node (rule 12)."""
        labels = sorted(self._labels[g] for g in logical)
        node = labels[0][0]
        assert all(label[0] == node for label in labels), f"{key} granted across nodes"
        by_index = {gpu.index: gpu for gpu in self._nodes[node]}
        gpus = tuple(index for _, index in labels)
        devices = tuple(by_index[g].device_id for g in gpus)
        placement = Placement(key, node, gpus, devices, units)
        del self._demands[key]
        self._leases[key] = placement
        return placement
