"""Moving page-cache pages of mapped files between nodes (hwpool._numa._place)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fakes.numa import PAGE, FakeKernel, cpu_nodes, plain_two_nodes, single_node
from hwpool._host._topology import CPUTopology
from hwpool._numa._kernel import buffer_span
from hwpool._numa._place import file_page_nodes, file_spans, place_file_pages
from hwpool._numa._results import NumaReason, PagePlacement


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[tuple[Path, mmap.mmap]]:
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(16 * PAGE))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        yield path, view


def setup(tmp_path: Path, path: Path, view: mmap.mmap) -> tuple[CPUTopology, FakeKernel, int]:
    topology = plain_two_nodes(tmp_path / "sys")
    kernel = FakeKernel(cpu_nodes(topology))
    base = buffer_span(view)[0]
    kernel.map_file(base, path)
    return topology, kernel, base


def test_file_spans_finds_the_file_and_offset(mapped: tuple[Path, mmap.mmap]) -> None:
    path, view = mapped
    kernel = FakeKernel()
    part = memoryview(view)[3 * PAGE : 5 * PAGE + 10]
    (span,) = file_spans(part, kernel)
    assert (span.path, span.offset, span.length) == (str(path), 3 * PAGE, 3 * PAGE)
    assert span.inode == os.stat(path).st_ino and span.shared and not span.writable
    part.release()


def test_a_far_side_off_its_node_is_dropped_and_reread_there(
    tmp_path: Path, mapped: tuple[Path, mmap.mmap]
) -> None:
    path, view = mapped
    topology, kernel, base = setup(tmp_path, path, view)
    kernel.place(base, 16 * PAGE, 0)  # everything was first read on node 0
    heard: list[int] = []
    mv = memoryview(view)
    home, far = [mv[: 8 * PAGE]], [mv[8 * PAGE :]]
    kw = {"topology": topology, "kernel": kernel, "on_move": heard.append}
    got = place_file_pages(home, far, (0, 1), **kw)  # type: ignore[arg-type]
    assert got == PagePlacement(8 * PAGE, 0, before=(1.0, 0.0), after=(1.0, 1.0))
    assert heard == [8 * PAGE] and kernel.reads == [(1, 8 * PAGE, 8 * PAGE)]
    assert kernel.unmapped == [(base + 8 * PAGE, 8 * PAGE)]  # read-only: safe to unmap first
    again = place_file_pages(home, far, (0, 1), **kw)  # type: ignore[arg-type]
    assert got.done and got.reason == NumaReason.PLACED
    assert again == PagePlacement(0, 0, (1.0, 1.0), (1.0, 1.0), NumaReason.ALREADY_PLACED)
    assert not again.done and heard == [8 * PAGE]
    mv.release()


def test_fill_reads_the_first_uncached_spans_on_their_node(
    tmp_path: Path, mapped: tuple[Path, mmap.mmap]
) -> None:
    path, view = mapped
    topology, kernel, base = setup(tmp_path, path, view)
    mv = memoryview(view)
    spans = [mv[i * 2 * PAGE : (i + 1) * 2 * PAGE] for i in range(8)]
    kernel.place(base + 10 * PAGE, 2 * PAGE, 1)  # far's second span is already on its node
    got = place_file_pages(spans[:4], spans[4:], (0, 1), fill=3, topology=topology, kernel=kernel)
    assert got is not None and (got.moved_bytes, got.filled_bytes) == (0, 5 * 2 * PAGE)
    assert sorted(kernel.reads) == [
        (0, 0, 2 * PAGE), (0, 2 * PAGE, 2 * PAGE), (0, 4 * PAGE, 2 * PAGE),
        (1, 8 * PAGE, 2 * PAGE), (1, 12 * PAGE, 2 * PAGE),
    ]  # fmt: skip
    assert got.after == (1.0, 1.0)
    for span in spans:
        span.release()
    mv.release()


def test_bad_arguments_are_refused_before_anything_moves(
    tmp_path: Path, mapped: tuple[Path, mmap.mmap]
) -> None:
    path, view = mapped
    topology, kernel, base = setup(tmp_path, path, view)
    kernel.place(base, 16 * PAGE, 0)
    ok = [view]

    def place(home: list[object], far: list[object], nodes: object, fill: int = 0) -> object:
        return place_file_pages(home, far, nodes, fill=fill, topology=topology, kernel=kernel)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=r"far\[0\] must lie in a memory-mapped file"):
        place(ok, [np.zeros(PAGE)], (0, 1))
    with pytest.raises(TypeError, match=r"home\[1\] must support the buffer protocol"):
        place([view, 7], ok, (0, 1))
    with pytest.raises(
        ValueError, match=r"nodes\[1\] must be one of the NUMA nodes \[0, 1\], got 4"
    ):
        place(ok, ok, (0, 4))
    with pytest.raises(ValueError, match="two different nodes"):
        place(ok, ok, (1, 1))
    with pytest.raises(TypeError, match="nodes must be"):
        place(ok, ok, 1)
    with pytest.raises(ValueError, match="fill must be >= 0, got -1"):
        place(ok, ok, (0, 1), fill=-1)
    with pytest.raises(TypeError, match=r"fill must be an int, got 1\.5"):
        place(ok, ok, (0, 1), fill=1.5)  # type: ignore[arg-type]
    assert kernel.reads == [] and kernel.unmapped == []


def test_nothing_is_done_on_one_node_or_for_a_deleted_file(
    tmp_path: Path, mapped: tuple[Path, mmap.mmap]
) -> None:
    path, view = mapped
    topology, kernel, _base = setup(tmp_path, path, view)
    one = single_node(tmp_path / "one")
    got = place_file_pages([view], [], (0, 0), topology=one, kernel=kernel)  # type: ignore[arg-type]
    assert got == PagePlacement.refused(NumaReason.SINGLE_NODE) and not got.done
    path.unlink()
    got = place_file_pages([view], [], (0, 1), topology=topology, kernel=kernel)
    assert got == PagePlacement.refused(NumaReason.FILE_UNAVAILABLE) and not got.done
    assert kernel.reads == []


linux_only = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="Linux only")


@linux_only
def test_file_page_nodes_sees_only_cached_pages(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(32 * PAGE))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        f.read()
    cached = file_page_nodes(path)
    assert sum(cached.values()) == 32
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if sum(file_page_nodes(path).values()) == 32:
        pytest.skip("this filesystem keeps the file cached (tmpfs?)")
    assert file_page_nodes(path) == {}
    empty = tmp_path / "empty"
    empty.touch()
    assert file_page_nodes(empty) == {}
    with pytest.raises(FileNotFoundError):
        file_page_nodes(tmp_path / "missing")
