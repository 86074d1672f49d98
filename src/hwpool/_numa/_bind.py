"""Keep a CPU pool's threads on the NUMA node(s) that hold its data.

``NumaBinder`` holds the binding state of one pool and does the work behind ``CPUPool.bind_numa``,
``bind_node``, ``bind_two_nodes``, ``unbind_two_nodes``, ``far_worker`` and
``place_file_pages``. Workers are bound by running ``set_affinity`` inside each of them through
the pool's own ``run``; the calling thread adopts its mask at its next dispatch (``adopt``).
Threads are bound to a set of CPUs, never pinned one per core.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from .._check import check_int
from .._host._topology import CPUTopology, cpu_topology
from ._kernel import Kernel
from ._pages import (
    BindReason,
    NumaBinding,
    buffer_spans,
    check_node,
    choose_cpus,
    choose_node,
    default_kernel,
    nodes_with_cpus,
    numa_mode,
    sample_spans,
)
from ._place import PagePlacement, place_file_pages

__all__ = ["NumaBinder", "TwoNodes"]


class TwoNodes(NamedTuple):
    """Two-node mode: the home and far nodes and how many participants run on each."""

    home: int
    far: int
    n_home: int
    n_far: int


class _Pool(Protocol):
    @property
    def n_participants(self) -> int: ...

    def run(self, f: Callable[[int, int], object]) -> object: ...


class NumaBinder:
    """The NUMA binding of one pool; see the module docstring.

    ``allowed`` is the CPU mask the pool was created with (default: the calling thread's), since
    a bound thread's own mask shows only its node. ``topology`` (default: :func:`cpu_topology`
    with that mask), ``kernel`` and ``environ`` are injectable for tests. All public methods are
    thread-safe; binding calls ``pool.run`` once.
    """

    def __init__(
        self,
        pool: _Pool,
        *,
        topology: Callable[[], CPUTopology] | None = None,
        kernel: Kernel | None = None,
        environ: Mapping[str, str] | None = None,
        allowed: Iterable[int] | None = None,
    ) -> None:
        self._pool = pool
        if topology is None:
            # Kept from the creator: a bound thread's own mask would show only its node.
            mask = cpu_topology().affinity if allowed is None else tuple(allowed)

            def topology() -> CPUTopology:
                return cpu_topology(affinity=mask)

        self._topology: Callable[[], CPUTopology] = topology
        self._kernel = kernel or default_kernel()
        self._environ = environ
        self._lock = threading.RLock()
        self._node: int | None = None
        self._two: TwoNodes | None = None
        self._caller_cpus: tuple[int, ...] | None = None
        self._generation = 0
        self._adopted = threading.local()

    @property
    def node(self) -> int | None:
        """The node the pool (or its home half) is bound to, None when unbound."""
        return self._node

    @property
    def two_nodes(self) -> TwoNodes | None:
        """The two-node split in force, or None."""
        return self._two

    def bind_numa(self, buffers: object) -> NumaBinding:
        """Bind the pool to the node holding >= 90% of the buffers' resident sample.

        Changes nothing when ``HWPOOL_NUMA`` is off, on fewer than two nodes, when less than
        half of the sample is resident, no node has 90% of it, or the node has too few CPUs.
        Raises TypeError/ValueError for a non-buffer (or a bad ``HWPOOL_NUMA``) first.
        """
        spans = buffer_spans(buffers, "buffers")
        mode = numa_mode(self._environ)
        if not mode.enabled:
            return NumaBinding(None, (), BindReason.DISABLED)
        topology = self._topology()
        if mode.node is not None:
            check_node(topology, mode.node, "HWPOOL_NUMA node")
        refused = self._refusal(topology)
        if refused is not None:
            return NumaBinding(None, (), refused)
        if mode.node is not None:
            return self._bind_all(topology, mode.node, BindReason.FORCED)
        node, reason = choose_node(sample_spans(spans, self._kernel))
        if node is None:
            return NumaBinding(None, (), reason)
        return self._bind_all(topology, node, reason)

    def bind_node(self, node: int) -> NumaBinding:
        """Bind the whole pool to ``node``'s CPUs (leaving two-node mode).

        Raises TypeError/ValueError for a node that does not exist; a no-op (with the reason)
        when binding is off, on fewer than two nodes, or where the node has too few CPUs.
        """
        topology = self._topology()
        check_node(topology, node)
        if not numa_mode(self._environ).enabled:
            return NumaBinding(None, (), BindReason.DISABLED)
        refused = self._refusal(topology)
        if refused is not None:
            return NumaBinding(None, (), refused)
        return self._bind_all(topology, node, BindReason.REQUESTED)

    def bind_two_nodes(self, hint: int | None = None) -> TwoNodes | None:
        """Put odd workers on a second node, even ones and the caller on the home node.

        The home node is the one ``bind_numa``/``bind_node`` chose, else ``hint``; the far
        node is the lowest-numbered other node with enough CPUs. None (nothing changed) when
        binding is off, there is no home node, fewer than two nodes, or too few CPUs.
        Raises TypeError/ValueError for a ``hint`` that is not an existing node.
        """
        topology = self._topology()
        if hint is not None:
            check_node(topology, hint, "hint")
        if not numa_mode(self._environ).enabled or self._refusal(topology) is not None:
            return None
        with self._lock:
            home = self._node if self._node is not None else hint
            n_far = (self._pool.n_participants - 1) // 2
            if home is None or n_far == 0:
                return None
            n_home = self._pool.n_participants - n_far
            home_cpus = choose_cpus(topology, home, n_home)
            far = self._far_node(topology, home, n_far)
            if home_cpus is None or far is None:
                return None
            far_cpus = choose_cpus(topology, far, n_far) or ()
            self._apply(lambda w: far_cpus if w % 2 else home_cpus, home_cpus)
            self._node, self._two = home, TwoNodes(home, far, n_home, n_far)
            return self._two

    def unbind_two_nodes(self) -> None:
        """Bring the far workers back: the whole pool on the home node, or unbound where the
        home node is too small for it. A no-op outside two-node mode."""
        with self._lock:
            if self._two is None:
                return
            topology = self._topology()
            cpus = choose_cpus(topology, self._two.home, self._pool.n_participants)
            if cpus is None:
                cpus, self._node = topology.affinity, None
            self._apply(lambda _w: cpus, cpus)
            self._two = None

    def far_worker(self, w: int) -> bool:
        """Whether participant ``w`` runs on the far node (odd workers in two-node mode).

        The caller (index ``n_participants - 1``) never does. Raises ValueError for an index
        outside ``range(n_participants)``.
        """
        n = self._pool.n_participants
        w = check_int("w", w)
        if not 0 <= w < n:
            raise ValueError(f"w must be a participant index in range({n}), got {w!r}")
        return self._two is not None and w < n - 1 and w % 2 == 1

    def place_file_pages(
        self,
        home: Sequence[object],
        far: Sequence[object],
        nodes: Sequence[int],
        *,
        fill: int = 0,
        on_move: Callable[[int], object] | None = None,
    ) -> PagePlacement | None:
        """See :func:`hwpool._numa_place.place_file_pages`; None when binding is off."""
        topology = self._topology()
        if not numa_mode(self._environ).enabled:
            return None
        return place_file_pages(
            home, far, nodes, topology=topology, kernel=self._kernel, fill=fill, on_move=on_move
        )

    def adopt(self) -> None:
        """Give the calling thread the caller's mask if it changed since it last adopted it."""
        cpus, generation = self._caller_cpus, self._generation
        if cpus is not None and getattr(self._adopted, "generation", -1) != generation:
            self._kernel.set_affinity(cpus)
            self._adopted.generation = generation

    def _refusal(self, topology: CPUTopology) -> BindReason | None:
        if not sys.platform.startswith("linux"):
            return BindReason.UNSUPPORTED
        if len(nodes_with_cpus(topology)) < 2:
            return BindReason.SINGLE_NODE
        return None

    def _far_node(self, topology: CPUTopology, home: int, n_far: int) -> int | None:
        for node in nodes_with_cpus(topology):
            if node != home and choose_cpus(topology, node, n_far) is not None:
                return node
        return None

    def _bind_all(self, topology: CPUTopology, node: int, reason: BindReason) -> NumaBinding:
        cpus = choose_cpus(topology, node, self._pool.n_participants)
        if cpus is None:
            return NumaBinding(node, (), BindReason.TOO_FEW_CPUS)
        with self._lock:
            self._apply(lambda _w: cpus, cpus)
            self._node, self._two = node, None
        return NumaBinding(node, cpus, reason)

    def _apply(
        self, worker_cpus: Callable[[int], tuple[int, ...]], caller: tuple[int, ...]
    ) -> None:
        """Bind each worker to ``worker_cpus(w)``; the caller adopts ``caller`` at dispatch."""
        n_workers = self._pool.n_participants - 1
        self._caller_cpus, self._generation = caller, self._generation + 1

        def bind(index: int, _n: int) -> None:
            if index < n_workers:
                self._kernel.set_affinity(worker_cpus(index))
            else:
                self.adopt()

        self._pool.run(bind)
