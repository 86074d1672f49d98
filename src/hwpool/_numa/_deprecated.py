"""The 0.1 NUMA methods of :class:`hwpool.CPUPool`, deprecated: use ``pool.numa`` instead.

Each warns (DeprecationWarning, naming its replacement) and keeps its 0.1 return value, so
code written for 0.1 runs unchanged. To be removed in 0.3.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from ._bind import NumaBinder
from ._results import NumaBinding, NumaReason, PagePlacement, TwoNodes

__all__ = ["DeprecatedNumaMethods"]


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"CPUPool.{old} is deprecated, use pool.numa.{new}", DeprecationWarning, stacklevel=3
    )


class DeprecatedNumaMethods:
    """Forwarders from the 0.1 names on the pool to its :class:`NumaBinder` (``pool.numa``)."""

    __slots__ = ()

    @property
    def numa(self) -> NumaBinder:  # provided by the pool
        raise NotImplementedError

    def bind_numa(self, buffers: object) -> NumaBinding:
        """Deprecated: ``pool.numa.bind(buffers)``."""
        _warn("bind_numa", "bind")
        return self.numa.bind(buffers)

    def bind_node(self, node: int) -> NumaBinding:
        """Deprecated: ``pool.numa.bind_node(node)``."""
        _warn("bind_node", "bind_node")
        return self.numa.bind_node(node)

    def bind_two_nodes(self, hint: int | None = None) -> TwoNodes | None:
        """Deprecated: ``pool.numa.bind_two_nodes(hint).two_nodes``."""
        _warn("bind_two_nodes", "bind_two_nodes")
        got = self.numa.bind_two_nodes(hint)
        return got.two_nodes if got.done else None

    @property
    def two_nodes(self) -> TwoNodes | None:
        """Deprecated: ``pool.numa.two_nodes``."""
        _warn("two_nodes", "two_nodes")
        return self.numa.two_nodes

    def far_worker(self, w: int) -> bool:
        """Deprecated: ``pool.numa.far_worker(w)``."""
        _warn("far_worker", "far_worker")
        return self.numa.far_worker(w)

    def unbind_two_nodes(self) -> None:
        """Deprecated: ``pool.numa.unbind_two_nodes()``."""
        _warn("unbind_two_nodes", "unbind_two_nodes")
        self.numa.unbind_two_nodes()

    def place_file_pages(
        self,
        home: Sequence[object],
        far: Sequence[object],
        nodes: Sequence[int],
        *,
        fill: int = 0,
        on_move: Callable[[int], object] | None = None,
    ) -> PagePlacement | None:
        """Deprecated: ``pool.numa.place_file_pages(...)`` (None where it said why not)."""
        _warn("place_file_pages", "place_file_pages")
        got = self.numa.place_file_pages(home, far, nodes, fill=fill, on_move=on_move)
        ran = got.reason in (NumaReason.PLACED, NumaReason.ALREADY_PLACED)
        return got if ran else None
