"""The NUMA methods of :class:`hwpool.CPUPool`, delegating to one :class:`NumaBinder` per pool.

Kept apart from ``_cpu_pool`` so that the pool's dispatch code stays about dispatch: the pool
only calls :meth:`NumaMethods._adopt_numa` when the caller starts a dispatch.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence

from ._bind import NumaBinder, TwoNodes
from ._pages import NumaBinding
from ._place import PagePlacement

__all__ = ["NumaMethods"]

_create_lock = threading.Lock()


class NumaMethods:
    """Mixin: NUMA binding for a pool with ``n_participants`` and ``run(f)``."""

    _numa: NumaBinder | None = None
    _numa_allowed: tuple[int, ...] | None = None

    @property
    def n_participants(self) -> int:  # provided by the pool
        raise NotImplementedError

    def run(self, f: Callable[[int, int], object]) -> None:  # provided by the pool
        raise NotImplementedError

    def bind_numa(self, buffers: object) -> NumaBinding:
        """Run the pool on the node holding >= 90% of ``buffers``' resident pages.

        ``buffers`` is a buffer (numpy array, memoryview, mmap) or a list of them. Every worker
        is bound to that node's CPUs (physical cores first, never fewer CPUs than
        ``n_participants``); the calling thread adopts the mask at its next dispatch. Returns
        the decision; nothing changes when it says ``bound`` is False. ``HWPOOL_NUMA``: ``0``/
        ``off`` disables binding, ``node:<n>`` forces node n. Raises TypeError for non-buffers.
        """
        return self._binder().bind_numa(buffers)

    def bind_node(self, node: int) -> NumaBinding:
        """Run the whole pool on ``node`` (leaving two-node mode); ValueError if no such node."""
        return self._binder().bind_node(node)

    def bind_two_nodes(self, hint: int | None = None) -> TwoNodes | None:
        """Odd workers on a second node, even workers and the caller on the home node.

        Home is the node of the last ``bind_numa``/``bind_node``, else ``hint``. Returns
        ``(home, far, n_home, n_far)``, or None when it cannot be done (nothing changes).
        """
        return self._binder().bind_two_nodes(hint)

    @property
    def two_nodes(self) -> TwoNodes | None:
        """The two-node split in force, or None."""
        return None if self._numa is None else self._numa.two_nodes

    def far_worker(self, w: int) -> bool:
        """Whether participant ``w`` runs on the far node; the caller never does."""
        return self._binder().far_worker(w)

    def unbind_two_nodes(self) -> None:
        """Bring the far workers back to the home node (a no-op outside two-node mode)."""
        self._binder().unbind_two_nodes()

    def place_file_pages(
        self,
        home: Sequence[object],
        far: Sequence[object],
        nodes: Sequence[int],
        *,
        fill: int = 0,
        on_move: Callable[[int], object] | None = None,
    ) -> PagePlacement | None:
        """Move the page-cache pages of mapped-file buffers: ``home`` to ``nodes[0]``, ``far``
        to ``nodes[1]`` (``nodes`` may be the result of :meth:`bind_two_nodes`).

        A side moves only when under 90% of its resident sample is on its node: its cached
        ranges are dropped (``POSIX_FADV_DONTNEED``) and read again by a thread bound to the
        node. ``fill``: of the first ``fill`` buffers of each side, those not cached at all are
        read by their node too. ``on_move(nbytes)`` hears the total first. None where this
        cannot be done (fewer than two nodes, binding off, a file that cannot be opened).
        Raises TypeError/ValueError for non-buffers, anonymous memory and unknown nodes.
        """
        if isinstance(nodes, TwoNodes):
            nodes = (nodes.home, nodes.far)
        return self._binder().place_file_pages(home, far, nodes, fill=fill, on_move=on_move)

    def _binder(self) -> NumaBinder:
        if self._numa is None:
            with _create_lock:
                if self._numa is None:
                    self._numa = NumaBinder(weakref.proxy(self), allowed=self._numa_allowed)
        return self._numa

    def _remember_cpu_mask(self) -> None:
        """Keep the creating thread's CPU mask: the CPUs binding may later choose from."""
        if hasattr(os, "sched_getaffinity"):
            self._numa_allowed = tuple(sorted(os.sched_getaffinity(0)))

    def _adopt_numa(self) -> None:
        """Give the calling thread the pool's caller mask (called as a dispatch starts)."""
        if self._numa is not None:
            self._numa.adopt()
