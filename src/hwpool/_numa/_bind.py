"""Keep a CPU pool's threads on the NUMA node(s) that hold its data.

A :class:`NumaBinder` is the NUMA part of one pool, held by composition (``pool.numa``): it
keeps the binding state and does the binding and page placement. Workers are bound by running
``set_affinity`` inside each of them through the pool's own ``run``; the calling thread adopts
its mask at its next dispatch (``_adopt``). Threads are bound to a set of CPUs, never pinned one
per core. Every action returns a result with ``done`` and ``reason`` (see ``_results``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from .._check import check_int
from .._host._topology import CPUTopology, cpu_topology
from ._kernel import Kernel
from ._pages import (
    buffer_spans,
    check_node,
    choose_cpus,
    choose_node,
    default_kernel,
    nodes_with_cpus,
    numa_mode,
    sample_spans,
)
from ._place import place_file_pages
from ._results import NumaBinding, NumaReason, PagePlacement, TwoNodes

__all__ = ["NumaBinder", "TwoNodes"]


class _Pool(Protocol):
    @property
    def n_participants(self) -> int: ...

    def run(self, f: Callable[[int, int], object]) -> object: ...


class NumaBinder:
    """The NUMA binding and page placement of one :class:`CPUPool`, as ``pool.numa``.

    Every action returns a :class:`NumaBinding` or :class:`PagePlacement` whose ``done`` and
    ``reason`` say what was done or why not; bad arguments raise TypeError/ValueError first.
    ``allowed`` is the CPU mask the pool was created with (default: the calling thread's),
    since a bound thread's own mask shows only its node. ``topology`` (default:
    :func:`cpu_topology` with that mask), ``kernel`` and ``environ`` are injectable for tests.
    All methods are thread-safe; binding calls ``pool.run`` once.
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
        self._given_kernel = kernel  # the real one is loaded at first use (ctypes, ldconfig)
        self._environ = environ
        self._lock = threading.RLock()
        self._node: int | None = None
        self._two: TwoNodes | None = None
        self._caller_cpus: tuple[int, ...] | None = None
        self._generation = 0
        self._adopted = threading.local()

    @property
    def _kernel(self) -> Kernel:
        return self._given_kernel or default_kernel()

    @property
    def node(self) -> int | None:
        """The node the pool (or its home half) is bound to, None when unbound."""
        return self._node

    @property
    def two_nodes(self) -> TwoNodes | None:
        """The two-node split in force, or None."""
        return self._two

    def bind(self, buffers: object) -> NumaBinding:
        """Bind the pool to the node holding >= 90% of the buffers' resident sample.

        ``buffers`` is a buffer (numpy array, memoryview, mmap) or a list of them. Changes
        nothing when ``HWPOOL_NUMA`` is off, on fewer than two nodes, when less than half of the
        sample is resident, no node has 90% of it, or the node has too few CPUs (the result
        says which). Raises TypeError/ValueError for a non-buffer (or a bad ``HWPOOL_NUMA``).
        """
        spans = buffer_spans(buffers, "buffers")
        mode = numa_mode(self._environ)
        if not mode.enabled:
            return NumaBinding(None, (), NumaReason.DISABLED)
        topology = self._topology()
        if mode.node is not None:
            check_node(topology, mode.node, "HWPOOL_NUMA node")
        refused = self._refusal(topology)
        if refused is not None:
            return NumaBinding(None, (), refused)
        if mode.node is not None:
            return self._bind_all(topology, mode.node, NumaReason.FORCED)
        node, reason = choose_node(sample_spans(spans, self._kernel))
        if node is None:
            return NumaBinding(None, (), reason)
        return self._bind_all(topology, node, reason)

    def bind_node(self, node: int) -> NumaBinding:
        """Bind the whole pool to ``node``'s CPUs (leaving two-node mode).

        Raises TypeError/ValueError for a node that does not exist; does nothing (and says why)
        when binding is off, on fewer than two nodes, or where the node has too few CPUs.
        """
        topology = self._topology()
        check_node(topology, node)
        refused = self._refusal(topology)
        if refused is not None:
            return NumaBinding(None, (), refused)
        return self._bind_all(topology, node, NumaReason.REQUESTED)

    def bind_two_nodes(self, hint: int | None = None) -> NumaBinding:
        """Put odd workers on a second node, even ones and the caller on the home node.

        The home node is the one ``bind``/``bind_node`` chose, else ``hint``; the far node is
        the lowest-numbered other node with enough CPUs. The result's ``two_nodes`` is the
        split; nothing changes (and the reason says why) when binding is off, there is no home
        node or no odd worker, fewer than two nodes, or too few CPUs. Raises
        TypeError/ValueError for a ``hint`` that is not an existing node.
        """
        topology = self._topology()
        if hint is not None:
            check_node(topology, hint, "hint")
        refused = self._refusal(topology)
        if refused is not None:
            return self._unchanged(refused)
        with self._lock:
            home = self._node if self._node is not None else hint
            n_far = (self._pool.n_participants - 1) // 2
            if home is None or n_far == 0:
                return self._unchanged(
                    NumaReason.NO_HOME_NODE if home is None else NumaReason.NO_FAR_WORKER
                )
            n_home = self._pool.n_participants - n_far
            home_cpus = choose_cpus(topology, home, n_home)
            far = self._far_node(topology, home, n_far)
            if home_cpus is None or far is None:
                return self._unchanged(NumaReason.TOO_FEW_CPUS)
            far_cpus = choose_cpus(topology, far, n_far) or ()
            self._apply(lambda w: far_cpus if w % 2 else home_cpus, home_cpus)
            self._node, self._two = home, TwoNodes(home, far, n_home, n_far)
            return NumaBinding(home, home_cpus, NumaReason.TWO_NODES, self._two)

    def unbind_two_nodes(self) -> NumaBinding:
        """Bring the far workers back: the whole pool on the home node (``HOME``), or unbound
        where the home node is too small for it (``UNBOUND``). ``NOT_TWO_NODES`` (nothing
        changed) outside two-node mode."""
        with self._lock:
            if self._two is None:
                return self._unchanged(NumaReason.NOT_TWO_NODES)
            topology = self._topology()
            cpus = choose_cpus(topology, self._two.home, self._pool.n_participants)
            reason = NumaReason.HOME
            if cpus is None:
                cpus, self._node, reason = topology.affinity, None, NumaReason.UNBOUND
            self._apply(lambda _w: cpus, cpus)
            self._two = None
            return NumaBinding(self._node, () if self._node is None else cpus, reason)

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
    ) -> PagePlacement:
        """Move the page-cache pages of mapped-file buffers: ``home`` to ``nodes[0]``, ``far``
        to ``nodes[1]`` (``nodes`` may be the ``TwoNodes`` of :meth:`bind_two_nodes`).

        A side moves only when under 90% of its resident sample is on its node: its cached
        ranges are dropped (``POSIX_FADV_DONTNEED``) and read again by a thread bound to the
        node. ``fill``: of the first ``fill`` buffers of each side, those not cached at all are
        read by their node too. ``on_move(nbytes)`` hears the total first. The result says why
        nothing moved (binding off, fewer than two nodes, a file that cannot be opened, already
        in place). Raises TypeError/ValueError for non-buffers, anonymous memory, unknown nodes.
        """
        if isinstance(nodes, TwoNodes):
            nodes = (nodes.home, nodes.far)
        topology = self._topology()
        if not numa_mode(self._environ).enabled:
            return PagePlacement.refused(NumaReason.DISABLED)
        return place_file_pages(
            home, far, nodes, topology=topology, kernel=self._kernel, fill=fill, on_move=on_move
        )

    def _adopt(self) -> None:
        """Give the calling thread the caller's mask if it changed since it last adopted it."""
        cpus, generation = self._caller_cpus, self._generation
        if cpus is not None and getattr(self._adopted, "generation", -1) != generation:
            self._kernel.set_affinity(cpus)
            self._adopted.generation = generation

    def _reset_after_fork(self) -> None:
        """A fresh lock in a forked child: the parent's may be held by a thread not copied."""
        self._lock = threading.RLock()

    def _refusal(self, topology: CPUTopology) -> NumaReason | None:
        """Why this binder cannot bind at all (off, not Linux, one node), or None."""
        if not numa_mode(self._environ).enabled:
            return NumaReason.DISABLED
        if not sys.platform.startswith("linux"):
            return NumaReason.UNSUPPORTED
        if len(nodes_with_cpus(topology)) < 2:
            return NumaReason.SINGLE_NODE
        return None

    def _unchanged(self, reason: NumaReason) -> NumaBinding:
        """The binding as it stands, with the reason nothing changed."""
        node, two = self._node, self._two
        return NumaBinding(node, () if node is None else self._caller_cpus or (), reason, two)

    def _far_node(self, topology: CPUTopology, home: int, n_far: int) -> int | None:
        for node in nodes_with_cpus(topology):
            if node != home and choose_cpus(topology, node, n_far) is not None:
                return node
        return None

    def _bind_all(self, topology: CPUTopology, node: int, reason: NumaReason) -> NumaBinding:
        cpus = choose_cpus(topology, node, self._pool.n_participants)
        if cpus is None:
            return NumaBinding(node, (), NumaReason.TOO_FEW_CPUS)
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
                self._adopt()

        self._pool.run(bind)
