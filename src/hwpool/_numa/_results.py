"""What every NUMA call returns: a result that says what was done, or why nothing was.

One convention for all of them (``bind``, ``bind_node``, ``bind_two_nodes``, ``unbind_two_nodes``,
``place_file_pages``): the call returns a frozen record with ``done`` (whether it changed
anything) and ``reason`` (a :class:`NumaReason`, whose text says what or why). No call answers
"nothing was done" with None, False or an exception; exceptions are kept for bad arguments.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

__all__ = ["NUMA_VAR", "NumaBinding", "NumaReason", "NumaResult", "PagePlacement", "TwoNodes"]

NUMA_VAR = "HWPOOL_NUMA"


class NumaReason(enum.StrEnum):
    """What a NUMA call did, or why it did nothing; :attr:`done` tells the two kinds apart."""

    # Something was done.
    BOUND = "bound to the node holding the data"
    FORCED = f"bound to the node forced by {NUMA_VAR}"
    REQUESTED = "bound to the requested node"
    TWO_NODES = "odd workers moved to the far node, the rest kept on the home node"
    HOME = "every participant back on the home node"
    UNBOUND = "the home node is too small for the whole pool: every participant unbound"
    PLACED = "page-cache pages re-read by the node they belong to"
    # Nothing was done, and why.
    DISABLED = f"binding turned off by {NUMA_VAR}"
    SINGLE_NODE = "fewer than two NUMA nodes with CPUs"
    UNSUPPORTED = "thread affinity is not supported on this platform"
    NOT_RESIDENT = "less than half of the sampled pages are resident"
    NO_MAJORITY = "no node holds 90% of the resident sample"
    TOO_FEW_CPUS = "the node has fewer usable CPUs than the pool has participants"
    NO_HOME_NODE = "no home node: bind the pool first or give a hint"
    NO_FAR_WORKER = "the pool has no odd worker to put on a far node"
    NOT_TWO_NODES = "the pool is not in two-node mode"
    ALREADY_PLACED = "nothing to move: each side has 90% of its resident sample on its node"
    FILE_UNAVAILABLE = "a mapped file cannot be opened or was replaced since it was mapped"

    @property
    def done(self) -> bool:
        """Whether a call that gives this reason changed something."""
        return self in _DONE


_DONE = frozenset(
    {
        NumaReason.BOUND,
        NumaReason.FORCED,
        NumaReason.REQUESTED,
        NumaReason.TWO_NODES,
        NumaReason.HOME,
        NumaReason.UNBOUND,
        NumaReason.PLACED,
    }
)


@runtime_checkable
class NumaResult(Protocol):
    """What every NUMA call returns: ``done`` and the ``reason`` that says what or why not."""

    @property
    def done(self) -> bool:
        """Whether the call changed anything."""
        ...

    @property
    def reason(self) -> NumaReason:
        """What was done, or why nothing was."""
        ...


class TwoNodes(NamedTuple):
    """Two-node mode: the home and far nodes and how many participants run on each."""

    home: int
    far: int
    n_home: int
    n_far: int


@dataclass(frozen=True, slots=True)
class NumaBinding:
    """What a binding call did: the node and CPUs the pool (or its home half) runs on, or why not.

    ``node`` is the (home) node, None when the pool is unbound; ``cpus`` the CPUs the caller
    and the home workers run on, empty when nothing was bound; ``two_nodes`` the split in force
    after the call (None outside two-node mode).
    """

    node: int | None
    cpus: tuple[int, ...]
    reason: NumaReason
    two_nodes: TwoNodes | None = None

    @property
    def done(self) -> bool:
        """Whether the call changed the pool's binding."""
        return self.reason.done

    @property
    def bound(self) -> bool:
        """Whether the pool's threads are restricted to ``cpus``."""
        return bool(self.cpus)


@dataclass(frozen=True, slots=True)
class PagePlacement:
    """What ``place_file_pages`` did: bytes re-read, and each side's share on its node.

    ``before``/``after`` are (home, far) fractions of each side's resident sampled pages that
    sit on that side's node (0.0 where nothing is resident or nothing was looked at).
    """

    moved_bytes: int
    filled_bytes: int
    before: tuple[float, float]
    after: tuple[float, float]
    reason: NumaReason = NumaReason.PLACED

    @property
    def done(self) -> bool:
        """Whether any page was re-read."""
        return self.reason.done

    @classmethod
    def refused(cls, reason: NumaReason) -> PagePlacement:
        """Nothing looked at, nothing moved, for ``reason``."""
        return cls(0, 0, (0.0, 0.0), (0.0, 0.0), reason)
