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

**GPUs of known sizes.** Where every GPU's memory is known (``NodeGPU.memory_mib``), the core
counts MiB (its GPUs' totals are their sizes) and a :class:`MemoryDemand` asks for MiB on one
GPU; a fraction is then a share of whichever GPU it lands on (the core's relative demand) and a
whole GPU is a whole GPU of any size. Where one size is unknown, the core counts fractions of
``UNITS_PER_GPU`` and memory cannot be asked for. A request is kept in the words it was made
in (:meth:`ClusterState._core_demand` turns it into the core's), so it survives a rebuild over
other GPUs.

Invariants after every call: on every GPU the units of its leases plus its free units in the
core equal one GPU; a request is waiting, leased or gone; every lease lies on one node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .._core._capacity import UNITS_PER_GPU, units_to_fraction
from .._core._demand import make_demand
from .._core._scheduler import Demand, Grant, Scheduler

__all__ = [
    "ClusterSnapshot",
    "ClusterState",
    "Key",
    "LeaseSnapshot",
    "MemoryDemand",
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
class MemoryDemand(Demand):
    """``units`` MiB on one GPU (``count`` is 1): a request made with ``memory=``. A plain
    :class:`Demand` counts ``UNITS_PER_GPU`` per GPU: ``count`` whole GPUs, or a fraction of
    one."""


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
    """A held lease: whose (``client``, ``request``), where, and the share of each GPU
    (with its MiB where the GPUs' sizes are known)."""

    client: str
    request: int
    node_id: str
    gpus: tuple[int, ...]
    fraction: float
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class WaitingSnapshot:
    """A waiting request, in queue order: ``count`` GPUs of ``fraction`` each, or
    ``memory_mib`` on one GPU (``fraction`` is then 0)."""

    client: str
    request: int
    count: int
    fraction: float
    memory_mib: int | None = None


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

    @property
    def largest_gpu_mib(self) -> int | None:
        """The memory of the largest GPU, if every GPU's is known (else None)."""
        return _largest_mib(gpu for node in self.nodes for gpu in node.gpus)


def _largest_mib(gpus: Iterable[NodeGPU]) -> int | None:
    sizes = [gpu.memory_mib for gpu in gpus]
    if not sizes or any(size is None for size in sizes):
        return None
    return max(size for size in sizes if size is not None)


def asked(demand: Demand) -> str:
    """``demand`` as the user asked for it: ``fraction=0.25``, ``one GPU``, ``gpus=2`` or
    ``memory=24576MiB``."""
    if isinstance(demand, MemoryDemand):
        return f"memory={demand.units}MiB"
    if demand.count > 1:
        return f"gpus={demand.count}"
    if demand.units < UNITS_PER_GPU:
        return f"fraction={units_to_fraction(demand.units):g}"
    return "one GPU"


def infeasible(demand: Demand, largest: int, largest_mib: int | None = None) -> str | None:
    """Why no node of a cluster whose largest node has ``largest`` GPUs (and whose largest
    GPU has ``largest_mib``, None if some GPU's size is unknown) could ever hold ``demand``
    (naming the demand and what to do), or None if one could."""
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
    if isinstance(demand, MemoryDemand) and largest_mib is None:
        return (
            f"{asked(demand)} needs the memory of every GPU of the cluster, and some node's is "
            "unknown: on nodes without nvidia-smi, give each GPU's size as the node resource "
            "hwpool_gpu_mib (ray start --resources='{\"hwpool_gpu_mib\": 24576}')"
        )
    if isinstance(demand, MemoryDemand) and largest_mib is not None and demand.units > largest_mib:
        return (
            f"{asked(demand)} is more than any GPU of the cluster has "
            f"(the largest has {largest_mib} MiB)"
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
        self._sizes: tuple[int, ...] | None = None  # each logical GPU's MiB, where all known

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
        """Free units of one GPU in the core: MiB where the GPUs' sizes are known, else of
        ``UNITS_PER_GPU``."""
        assert self._core is not None
        return self._core.free[self._logical[node_id, index]]

    @property
    def sized(self) -> bool:
        """Whether the core counts MiB (every GPU's memory is known)."""
        return self._sizes is not None

    def _free_fraction(self, node_id: str, gpu: NodeGPU) -> float:
        free = self.free_units(node_id, gpu.index)
        total = UNITS_PER_GPU if gpu.memory_mib is None or not self.sized else gpu.memory_mib
        return free / total

    def _lease_snapshot(self, p: Placement) -> LeaseSnapshot:
        if not self.sized:
            return LeaseSnapshot(p.key[0], p.key[1], p.node_id, p.gpus, units_to_fraction(p.units))
        size = {gpu.index: gpu.memory_mib or 1 for gpu in self._nodes[p.node_id]}[p.gpus[0]]
        mib = p.units or size  # a whole GPU of any size holds its size (units 0)
        return LeaseSnapshot(p.key[0], p.key[1], p.node_id, p.gpus, mib / size, mib)

    def _waiting_snapshot(self, key: Key, d: Demand) -> WaitingSnapshot:
        if isinstance(d, MemoryDemand):
            return WaitingSnapshot(key[0], key[1], d.count, 0.0, d.units)
        return WaitingSnapshot(key[0], key[1], d.count, units_to_fraction(d.units))

    def snapshot(self) -> ClusterSnapshot:
        """Nodes with free capacity per GPU, the leases, and the queue in order."""
        nodes = tuple(
            NodeSnapshot(node, gpus, tuple(self._free_fraction(node, g) for g in gpus))
            for node, gpus in self._nodes.items()
        )
        leases = tuple(self._lease_snapshot(p) for p in self._leases.values())
        waiting = tuple(self._waiting_snapshot(key, d) for key, d in self.waiting())
        return ClusterSnapshot(nodes, leases, waiting)

    def infeasible(self, demand: Demand) -> str | None:
        """Why no node of the cluster could ever hold ``demand``, or None if one could."""
        return infeasible(demand, self.largest_node, _largest_mib(self._all_gpus()))

    def _all_gpus(self) -> Iterable[NodeGPU]:
        return (gpu for gpus in self._nodes.values() for gpu in gpus)

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
            pairs = list(self._held(placement))
            self._absorb(self._core.release_many(pairs, now=self._now), out)
        return out

    def _held(self, placement: Placement) -> Iterable[tuple[int, int]]:
        """``(logical GPU, units)`` that ``placement`` holds (units 0: a whole GPU of any
        size, which holds the GPU's total)."""
        assert self._core is not None
        totals = self._core.totals
        for g in placement.gpus:
            logical = self._logical[placement.node_id, g]
            yield logical, placement.units or totals[logical]

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
        sizes = [gpu.memory_mib for gpus in nodes.values() for gpu in gpus]
        known = [size for size in sizes if size is not None]
        self._sizes = tuple(known) if known and len(known) == len(sizes) else None
        groups = [node for node, _ in self._labels]  # rule 12: one node's GPUs for a task
        if not self._labels:
            self._core = None
        else:
            self._core = Scheduler(self._sizes or len(self._labels), groups=groups)
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
            held = list(self._held(placement))
            if placement.units:
                self._core.restore(tuple(g for g, _ in held), placement.units)
            else:  # whole GPUs of different sizes: each holds its own total
                free = self._core.free
                if any(free[g] < units for g, units in held):
                    return False
                for g, units in held:
                    self._core.restore((g,), units)
        except (KeyError, ValueError):
            return False
        self._leases[placement.key] = placement
        return True

    def _submit(self, key: Key, demand: Demand) -> list[Grant]:
        """Queue ``demand`` in the core; its grant, if it was granted at once."""
        assert self._core is not None
        self._demands[key] = demand
        ticket, grant = self._core.submit(self._core_demand(demand), now=self._now)
        self._tickets[ticket] = key
        self._ticket_of[key] = ticket
        return [] if grant is None else [grant]

    def _core_demand(self, demand: Demand) -> Demand:
        """``demand`` in the core's units: as is on GPUs of unknown sizes (fractions of
        ``UNITS_PER_GPU``); on GPUs of known sizes, MiB as is, whole GPUs of any size, and a
        fraction as a share of whichever GPU it lands on."""
        sizes = self._sizes
        if sizes is not None and isinstance(demand, MemoryDemand):
            return make_demand(memory=demand.units, totals=sizes)
        return make_demand(count=demand.count, units=demand.units, totals=sizes, keep_shares=True)

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
