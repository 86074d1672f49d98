"""Move the page-cache pages of memory-mapped files to chosen NUMA nodes, without move_pages.

A container often may not call ``move_pages``/``mbind``, but the page cache puts a page on the
node of the thread that first reads it. So a file range is moved by dropping it from the page
cache (``POSIX_FADV_DONTNEED``, after unmapping it from this process where that is safe) and
reading it again from a thread bound to the wanted node, with readahead off so that neighbouring
ranges meant for the other node are not pulled in too.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._check import check_int
from .._host._topology import CPUTopology
from ._kernel import Kernel, buffer_span
from ._pages import DEFAULT_SAMPLE, MAJORITY, check_node, nodes_with_cpus, page_nodes, sample_span
from ._results import NumaReason, PagePlacement

__all__ = ["FileSpan", "PagePlacement", "file_page_nodes", "file_spans", "place_file_pages"]

PLACE_SAMPLE = 1024


@dataclass(frozen=True, slots=True)
class FileSpan:
    """A piece of a buffer that maps ``length`` bytes of ``path`` from ``offset`` at ``addr``."""

    addr: int
    length: int
    path: str
    offset: int
    device: tuple[int, int]
    inode: int
    shared: bool
    writable: bool


def file_spans(buffer: object, kernel: Kernel, name: str = "buffer") -> list[FileSpan]:
    """The file mappings under ``buffer``, from ``/proc/self/maps``, rounded out to pages.

    Raises TypeError for a non-buffer and ValueError when any page of it is not a file mapping
    (anonymous memory, heap, stack). Returns [] for an empty buffer.
    """
    addr, length = buffer_span(buffer, name)
    if length == 0:
        return []
    page = kernel.page_size
    start, end = addr - addr % page, -(-(addr + length) // page) * page
    maps = kernel.read_proc("maps")
    if maps is None:
        raise OSError(f"cannot read /proc/self/maps to find the file under {name}")
    spans = [s for s in _parse_maps(maps) if s.addr < end and s.addr + s.length > start]
    spans = [_clip(s, start, end) for s in spans]
    if sum(s.length for s in spans) != end - start or any(not s.path for s in spans):
        raise ValueError(f"{name} must lie in a memory-mapped file, not anonymous memory")
    return spans


def _parse_maps(text: str) -> list[FileSpan]:
    spans = []
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        major, minor = (int(x, 16) for x in fields[3].split(":"))
        inode = int(fields[4])
        path = fields[5] if len(fields) > 5 and inode and fields[5].startswith("/") else ""
        perms = fields[1]
        spans.append(
            FileSpan(low, high - low, path, int(fields[2], 16), (major, minor), inode,
                     perms[3] == "s", perms[1] == "w")
        )  # fmt: skip
    return spans


def _clip(span: FileSpan, start: int, end: int) -> FileSpan:
    low, high = max(span.addr, start), min(span.addr + span.length, end)
    offset = span.offset + (low - span.addr)
    return FileSpan(low, high - low, span.path, offset, span.device, span.inode,
                    span.shared, span.writable)  # fmt: skip


def place_file_pages(
    home: Sequence[object],
    far: Sequence[object],
    nodes: Sequence[int],
    *,
    topology: CPUTopology,
    kernel: Kernel,
    fill: int = 0,
    on_move: Callable[[int], object] | None = None,
) -> PagePlacement:
    """Put the page-cache pages of ``home`` on ``nodes[0]`` and of ``far`` on ``nodes[1]``.

    A side is re-read only when under 90% of its resident sample sits on its node; of the first
    ``fill`` buffers of each side, those with no page cached are read by their node first.
    ``on_move(nbytes)`` hears the total before any reading. Where nothing moves, the result's
    reason says why: ``SINGLE_NODE`` (fewer than two nodes with CPUs), ``FILE_UNAVAILABLE`` (a
    file this process cannot open or that was replaced), ``ALREADY_PLACED``.
    Raises TypeError/ValueError for non-buffers, anonymous memory, unknown or equal nodes, or
    a negative ``fill``; nothing is touched then.
    """
    if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence) or len(nodes) != 2:
        raise TypeError(f"nodes must be (home node, far node), got {nodes!r}")
    fill = check_int("fill", fill, minimum=0)
    sides = [
        [file_spans(b, kernel, f"{label}[{i}]") for i, b in enumerate(side)]
        for label, side in (("home", home), ("far", far))
    ]
    if len(nodes_with_cpus(topology)) < 2:
        return PagePlacement.refused(NumaReason.SINGLE_NODE)
    home_node, far_node = _check_nodes(topology, nodes)
    if not _files_open(sides):
        return PagePlacement.refused(NumaReason.FILE_UNAVAILABLE)
    targets = (home_node, far_node)
    before = tuple(_on_node(side, node, kernel) for side, node in zip(sides, targets, strict=True))
    plans = [_plan(side, before[i], fill, kernel) for i, side in enumerate(sides)]
    moved = sum(s.length for plan in plans for s in plan[0])
    filled = sum(s.length for plan in plans for s in plan[1])
    if on_move is not None and moved + filled:
        on_move(moved + filled)
    errors: list[BaseException] = []
    workers = [
        threading.Thread(
            target=_reread, args=(plan[0], plan[1], _cpus_of(topology, node), kernel, errors),
            name=f"hwpool-numa-place-{node}", daemon=True,
        )
        for plan, node in zip(plans, targets, strict=True)
    ]  # fmt: skip
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    after = tuple(_on_node(side, node, kernel) for side, node in zip(sides, targets, strict=True))
    reason = NumaReason.PLACED if moved + filled else NumaReason.ALREADY_PLACED
    return PagePlacement(moved, filled, _fractions(before), _fractions(after), reason)


def _check_nodes(topology: CPUTopology, nodes: Sequence[int]) -> tuple[int, int]:
    home = check_node(topology, nodes[0], "nodes[0]")
    far = check_node(topology, nodes[1], "nodes[1]")
    if home == far:
        raise ValueError(f"nodes must name two different nodes, got {nodes!r}")
    return home, far


def _files_open(sides: list[list[list[FileSpan]]]) -> bool:
    """Whether every mapped file can be opened and is still the file that is mapped."""
    for spans in {s.path: s for side in sides for buf in side for s in buf}.values():
        try:
            info = os.stat(spans.path)
            with open(spans.path, "rb"):
                pass
        except OSError:
            return False
        if info.st_ino != spans.inode:
            return False
    return True


def _on_node(side: list[list[FileSpan]], node: int, kernel: Kernel) -> tuple[int, int]:
    """(pages on ``node``, resident pages) in a sample of a side's spans."""
    on, resident = 0, 0
    count = max(1, PLACE_SAMPLE // max(1, sum(len(b) for b in side)))
    for span in (s for buf in side for s in buf):
        got = sample_span(span.addr, span.length, sample=count, kernel=kernel)
        on, resident = on + got.nodes.get(node, 0), resident + got.resident
    return on, resident


def _plan(
    side: list[list[FileSpan]], on_node: tuple[int, int], fill: int, kernel: Kernel
) -> tuple[list[FileSpan], list[FileSpan]]:
    """(spans to drop and re-read, uncached spans among the first ``fill`` buffers to read)."""
    on, resident = on_node
    num, den = MAJORITY
    cached = [[_is_cached(s, kernel) for s in buf] for buf in side]
    move: list[FileSpan] = []
    if resident and on * den < resident * num:
        move = [
            s
            for buf, flags in zip(side, cached, strict=True)
            for s, c in zip(buf, flags, strict=True)
            if c
        ]
    fills = [
        s for buf, flags in zip(side[:fill], cached, strict=False) if not any(flags) for s in buf
    ]
    return move, fills


def _is_cached(span: FileSpan, kernel: Kernel) -> bool:
    try:
        return any(flag & 1 for flag in kernel.resident(span.addr, span.length))
    except OSError:
        return False


def _cpus_of(topology: CPUTopology, node: int) -> tuple[int, ...]:
    usable = set(topology.affinity)
    return tuple(
        c for entry in topology.nodes if entry.id == node for c in entry.cpus if c in usable
    )


def _reread(
    move: list[FileSpan],
    fills: list[FileSpan],
    cpus: tuple[int, ...],
    kernel: Kernel,
    errors: list[BaseException],
) -> None:
    """In a thread of its own: bind to ``cpus``, drop ``move`` from the cache, read both lists."""
    try:
        _drop_and_read(move, fills, cpus, kernel)
    except BaseException as exc:  # re-raised by the caller after both threads are done
        errors.append(exc)


def _drop_and_read(
    move: list[FileSpan], fills: list[FileSpan], cpus: tuple[int, ...], kernel: Kernel
) -> None:
    kernel.set_affinity(cpus)
    for span in move:
        if span.shared or not span.writable:  # a private writable page may hold changes
            kernel.unmap_pages(span.addr, span.length)
        with open(span.path, "rb") as f:
            kernel.drop_cached(f.fileno(), span.offset, span.length)
    for span in [*move, *fills]:
        with open(span.path, "rb") as f:
            kernel.read_range(f.fileno(), span.offset, span.length)


def file_page_nodes(
    path: str | os.PathLike[str], *, sample: int = DEFAULT_SAMPLE
) -> dict[int, int]:
    """How many sampled pages of the file at ``path`` the page cache holds on each node.

    Maps the file read-only for the query, so only pages already cached are counted (nothing
    is read from disk). Raises OSError when the file cannot be opened; ``{}`` for an empty file.
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return {}
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return page_nodes(view, sample=sample)


def _fractions(pairs: tuple[tuple[int, int], ...]) -> tuple[float, float]:
    home, far = ((on / resident if resident else 0.0) for on, resident in pairs)
    return home, far
