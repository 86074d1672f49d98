"""Where a buffer's pages sit, and which NUMA node (and CPUs) a pool should run on.

``page_nodes`` samples a buffer's pages evenly, skips the ones that are not resident (mincore)
and asks the kernel for the node of each (a query-only ``move_pages``), falling back to
``/proc/self/numa_maps`` where a sandbox refuses ``move_pages``. The decision functions are pure:
``choose_node`` applies the 90% rule to a sample, ``choose_cpus`` picks a node's CPUs for a pool
without ever giving it fewer CPUs than participants. ``HWPOOL_NUMA`` is read here only.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .._check import check_int, is_ascii_int
from .._host._topology import CPUTopology
from ._kernel import Kernel, LinuxKernel, buffer_span
from ._results import NUMA_VAR, NumaBinding, NumaReason

__all__ = [
    "NUMA_VAR",
    "BindReason",
    "NumaBinding",
    "NumaMode",
    "PageSample",
    "choose_cpus",
    "choose_node",
    "default_kernel",
    "numa_mode",
    "page_nodes",
    "sample_pages",
]

DEFAULT_SAMPLE = 4096
# A node "holds" data when it has this share of the resident sample (9/10).
MAJORITY = (9, 10)
_NUMA_MAPS_NODE = re.compile(r"\bN(\d+)=(\d+)\b")

_kernel: Kernel | None = None


def default_kernel() -> Kernel:
    """The process-wide :class:`LinuxKernel` (created on first use)."""
    global _kernel
    if _kernel is None:
        _kernel = LinuxKernel()
    return _kernel


@dataclass(frozen=True, slots=True)
class NumaMode:
    """What ``HWPOOL_NUMA`` asks for: binding on or off, and a forced node if any."""

    enabled: bool = True
    node: int | None = None


def numa_mode(environ: Mapping[str, str] | None = None) -> NumaMode:
    """Parse ``HWPOOL_NUMA``: unset, ``""``, ``1``, ``on`` or ``auto`` (decide from the data),
    ``0`` or ``off`` (never bind), ``node:<n>`` (always node n).

    Raises ValueError naming the variable and its value for anything else.
    """
    env = os.environ if environ is None else environ
    raw = env.get(NUMA_VAR)
    text = "" if raw is None else raw.strip().lower()
    if text in ("", "1", "on", "auto"):
        return NumaMode()
    if text in ("0", "off"):
        return NumaMode(enabled=False)
    number = text.removeprefix("node:")
    if text.startswith("node:") and is_ascii_int(number):
        return NumaMode(node=int(number))
    raise ValueError(f"{NUMA_VAR} must be 0, off, on or node:<n>, got {raw!r}")


@dataclass(frozen=True, slots=True)
class PageSample:
    """A sample of a buffer's pages: how many were sampled, resident, and on each node.

    ``sum(nodes.values()) <= resident <= sampled``: resident pages whose node could not be
    learnt are counted as resident only.
    """

    sampled: int = 0
    resident: int = 0
    nodes: Mapping[int, int] = field(default_factory=dict)

    def __add__(self, other: PageSample) -> PageSample:
        merged = dict(self.nodes)
        for node, count in other.nodes.items():
            merged[node] = merged.get(node, 0) + count
        return PageSample(self.sampled + other.sampled, self.resident + other.resident, merged)


def page_nodes(buffer: object, *, sample: int = DEFAULT_SAMPLE) -> dict[int, int]:
    """How many sampled pages of ``buffer`` sit on each NUMA node.

    ``buffer`` is anything with the buffer protocol (numpy array, memoryview, mmap), contiguous.
    At most ``sample`` pages are sampled, evenly; pages that are not resident are skipped. Empty
    where nothing is known (not Linux, nothing resident, placement queries refused).
    Raises TypeError for a non-buffer, ValueError for a strided buffer or ``sample < 1``.
    """
    return dict(sample_pages(buffer, sample=sample).nodes)


def sample_pages(
    buffer: object, *, sample: int = DEFAULT_SAMPLE, kernel: Kernel | None = None
) -> PageSample:
    """Sample ``buffer``'s pages as :func:`page_nodes` does, keeping the resident count too."""
    sample = check_int("sample", sample, minimum=1)
    addr, length = buffer_span(buffer)
    return sample_span(addr, length, sample=sample, kernel=kernel or default_kernel())


def sample_span(addr: int, length: int, *, sample: int, kernel: Kernel) -> PageSample:
    """Sample the pages of ``[addr, addr + length)``; see :func:`page_nodes`."""
    if length <= 0:
        return PageSample()
    pages = _sampled_pages(addr, length, sample, kernel.page_size)
    try:
        resident = _resident_pages(pages, addr, length, kernel)
    except OSError:
        return PageSample(len(pages))
    if not resident:
        return PageSample(len(pages))
    # A resident file page must be mapped for the kernel to report its node; a page that
    # cannot be read (past the end of a truncated file) is not resident after all.
    resident = kernel.touch(resident)
    if not resident:
        return PageSample(len(pages))
    try:
        nodes = _nodes_by_move_pages(resident, kernel)
    except PermissionError:
        nodes = _nodes_by_numa_maps(resident, kernel)
    except OSError:
        nodes = {}
    return PageSample(len(pages), len(resident), nodes)


def _sampled_pages(addr: int, length: int, sample: int, page: int) -> list[int]:
    """Start addresses of at most ``sample`` pages spread evenly over the span."""
    first = addr - addr % page
    count = -(-(addr + length - first) // page)
    if count <= sample:
        return [first + i * page for i in range(count)]
    return [first + (i * count // sample) * page for i in range(sample)]


def _resident_pages(pages: list[int], addr: int, length: int, kernel: Kernel) -> list[int]:
    page = kernel.page_size
    if len(pages) > 1 and pages[1] - pages[0] == page:  # every page: one call for the span
        vec = kernel.resident(addr, length)
        return [p for p, flag in zip(pages, vec, strict=False) if flag & 1]
    return [p for p in pages if kernel.resident(p, page)[0] & 1]


def _nodes_by_move_pages(pages: Sequence[int], kernel: Kernel) -> dict[int, int]:
    nodes: dict[int, int] = {}
    for status in kernel.page_nodes(pages):
        if status >= 0:
            nodes[status] = nodes.get(status, 0) + 1
    return nodes


def _nodes_by_numa_maps(pages: Sequence[int], kernel: Kernel) -> dict[int, int]:
    """Share the sampled pages of each mapping out by that mapping's per-node page counts."""
    text = kernel.read_proc("numa_maps")
    maps = kernel.read_proc("maps")
    if not text or not maps:
        return {}
    counts = _numa_maps_counts(text)
    nodes: dict[int, int] = {}
    for (start, _end), in_range in _pages_per_mapping(pages, maps).items():
        for node, share in _apportion(counts.get(start, {}), in_range).items():
            nodes[node] = nodes.get(node, 0) + share
    return {node: count for node, count in nodes.items() if count}


def _numa_maps_counts(text: str) -> dict[int, dict[int, int]]:
    """Per mapping start address, the ``N<node>=<pages>`` counts of ``/proc/self/numa_maps``."""
    counts: dict[int, dict[int, int]] = {}
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        try:
            start = int(head, 16)
        except ValueError:
            continue
        counts[start] = {int(n): int(c) for n, c in _NUMA_MAPS_NODE.findall(rest)}
    return counts


def _pages_per_mapping(pages: Sequence[int], maps: str) -> dict[tuple[int, int], int]:
    """How many of ``pages`` fall in each mapping of ``/proc/self/maps``."""
    ordered = sorted(pages)
    found: dict[tuple[int, int], int] = {}
    for line in maps.splitlines():
        low, _, high = line.partition(" ")[0].partition("-")
        try:
            start, end = int(low, 16), int(high, 16)
        except ValueError:
            continue
        inside = bisect.bisect_left(ordered, end) - bisect.bisect_left(ordered, start)
        if inside:
            found[(start, end)] = inside
    return found


def _apportion(counts: Mapping[int, int], total: int) -> dict[int, int]:
    """Split ``total`` in proportion to ``counts`` (largest remainders), summing to ``total``."""
    whole = sum(counts.values())
    if whole == 0:
        return {}
    shares = {node: count * total // whole for node, count in counts.items()}
    left = total - sum(shares.values())
    by_remainder = sorted(counts, key=lambda n: (-(counts[n] * total % whole), n))
    for node in by_remainder[:left]:
        shares[node] += 1
    return shares


BindReason = NumaReason  # the 0.1 name, kept as an alias


def choose_node(sample: PageSample) -> tuple[int | None, NumaReason]:
    """The node holding >= 90% of the resident sample, or None with the reason.

    Gives up when less than half of the sampled pages are resident.
    """
    if sample.resident == 0 or 2 * sample.resident < sample.sampled:
        return None, NumaReason.NOT_RESIDENT
    num, den = MAJORITY
    for node, count in sorted(sample.nodes.items()):
        if count * den >= sample.resident * num:
            return node, NumaReason.BOUND
    return None, NumaReason.NO_MAJORITY


def choose_cpus(topology: CPUTopology, node: int, n_participants: int) -> tuple[int, ...] | None:
    """The CPUs to run ``n_participants`` threads on ``node``, or None when it has too few.

    Prefers the node's physical cores (the first usable SMT sibling of each core) when there
    are at least ``n_participants`` of them, else all its usable CPUs when there are enough.
    Usable means in the process's affinity. Raises ValueError for an unknown node.
    """
    usable = set(node_cpus(topology, node)) & set(topology.affinity)
    cores = sorted(
        {min(set(group) & usable) for group in topology.smt_groups if set(group) & usable}
    )
    cores += sorted(usable - {cpu for group in topology.smt_groups for cpu in group})
    if len(cores) >= n_participants:
        return tuple(sorted(cores))
    if len(usable) >= n_participants:
        return tuple(sorted(usable))
    return None


def node_cpus(topology: CPUTopology, node: int) -> tuple[int, ...]:
    """The online CPUs of ``node``; raises ValueError naming it when it does not exist."""
    for entry in topology.nodes:
        if entry.id == node:
            return entry.cpus
    known = [entry.id for entry in topology.nodes]
    raise ValueError(f"node must be one of the NUMA nodes {known}, got {node!r}")


def check_node(topology: CPUTopology, node: object, name: str = "node") -> int:
    """Validate a node number against the topology; TypeError/ValueError naming ``name``."""
    node = check_int(name, node)
    known = [entry.id for entry in topology.nodes]
    if node not in known:
        raise ValueError(f"{name} must be one of the NUMA nodes {known}, got {node!r}")
    return node


def nodes_with_cpus(topology: CPUTopology) -> list[int]:
    """The ids of the nodes that have at least one usable CPU."""
    usable = set(topology.affinity)
    return [entry.id for entry in topology.nodes if usable & set(entry.cpus)]


def buffer_spans(buffers: object, name: str) -> list[tuple[int, int]]:
    """(address, length) of each buffer in ``buffers`` (one buffer or an iterable of them).

    Every buffer is checked before anything is sampled: TypeError/ValueError naming
    ``name[i]`` for the first bad one.
    """
    return [buffer_span(b, f"{name}[{i}]") for i, b in enumerate(_as_list(buffers, name))]


def sample_spans(spans: Iterable[tuple[int, int]], kernel: Kernel) -> PageSample:
    """The merged page sample of several spans, :data:`DEFAULT_SAMPLE` pages at most each."""
    total = PageSample()
    for addr, length in spans:
        total = total + sample_span(addr, length, sample=DEFAULT_SAMPLE, kernel=kernel)
    return total


def _as_list(buffers: object, name: str) -> list[object]:
    """``buffers`` as a list; a single buffer-protocol object counts as a list of one."""
    try:
        memoryview(buffers).release()  # type: ignore[arg-type]
    except TypeError:
        pass
    else:
        return [buffers]
    if isinstance(buffers, str) or not isinstance(buffers, Iterable):
        raise TypeError(f"{name} must be a buffer or a list of buffers, got {buffers!r:.60}")
    return list(buffers)
