"""The NUMA code against a real kernel with two or more nodes.

These tests skip unless this host really has two nodes with CPUs; ``tests/numa/vm/run.sh`` runs
them in a two-node VM. Each binds only threads of its own, never the test runner's thread.
``HWPOOL_NUMA_TEST_FILE`` names a file on a disk-backed filesystem (the VM's root is 9p) for the
page-cache tests; without it they write one in the pytest temporary directory.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from hwpool import CPUPool
from hwpool._host._topology import cpu_topology
from hwpool._numa._bind import NumaBinder
from hwpool._numa._kernel import LinuxKernel
from hwpool._numa._pages import choose_cpus, nodes_with_cpus, page_nodes, sample_pages
from hwpool._numa._place import file_page_nodes, place_file_pages
from hwpool._numa._results import NumaReason

T = TypeVar("T")
TOPOLOGY = cpu_topology()
NODES = nodes_with_cpus(TOPOLOGY)
pytestmark = pytest.mark.skipif(len(NODES) < 2, reason="needs a host with two NUMA nodes")
SIZE = 4 << 20


def on_node(node: int, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a new thread bound to ``node``'s CPUs and return its result."""
    out: list[T] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            os.sched_setaffinity(0, choose_cpus(TOPOLOGY, node, 1) or ())
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the bound thread did not finish"
    if errors:
        raise errors[0]
    return out[0]


def filled_on(node: int) -> mmap.mmap:
    """A shared anonymous mapping (its own VMA) first written from ``node``."""
    region = mmap.mmap(-1, SIZE)

    def fill() -> mmap.mmap:
        region.write(b"\x01" * SIZE)
        return region

    return on_node(node, fill)


class RefusingKernel(LinuxKernel):
    """The real kernel, except that move_pages is refused as under a seccomp filter."""

    def page_nodes(self, addrs: object) -> list[int]:  # type: ignore[override]
        raise PermissionError(1, "move_pages refused")


@pytest.mark.parametrize("node", NODES[:2])
def test_page_nodes_finds_first_touch_node(node: int) -> None:
    region = filled_on(node)
    assert page_nodes(region, sample=128) == {node: 128}
    fallback = sample_pages(region, sample=128, kernel=RefusingKernel())
    assert fallback.nodes == {node: 128}  # /proc/self/numa_maps agrees
    region.close()


def test_bind_numa_binds_the_thread_running_the_pool() -> None:
    region = filled_on(NODES[1])

    class OneThreadPool:
        n_participants = 1

        def run(self, f: Callable[[int, int], object]) -> None:
            f(0, 1)

    binder = NumaBinder(OneThreadPool(), environ={})  # created unbound, like a pool

    def bind() -> tuple[object, set[int]]:
        got = binder.bind([region])
        return got, os.sched_getaffinity(0)

    binding, mask = on_node(NODES[0], bind)
    cpus = choose_cpus(TOPOLOGY, NODES[1], 1)
    assert binding.node == NODES[1] and binding.cpus == cpus  # type: ignore[attr-defined]
    assert mask == set(cpus or ())
    region.close()


def test_a_real_cpu_pool_binds_its_caller_thread() -> None:
    region = filled_on(NODES[1])
    cpus = choose_cpus(TOPOLOGY, NODES[1], 1)
    with CPUPool(0) as pool:  # one CPU per node in the VM: the caller is the whole team

        def bind_then_run() -> tuple[object, set[int]]:
            got = pool.numa.bind(region)
            seen: list[set[int]] = []
            pool.run(lambda i, n: seen.append(os.sched_getaffinity(0)))
            return got, seen[0]

        binding, mask = on_node(NODES[0], bind_then_run)
        assert binding.cpus == cpus and mask == set(cpus or ())  # type: ignore[attr-defined]
        nothing = pool.numa.place_file_pages([], [], (NODES[0], NODES[1]))
        assert nothing.reason == NumaReason.ALREADY_PLACED
    region.close()


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    given = os.environ.get("HWPOOL_NUMA_TEST_FILE")
    if given:
        return Path(given)
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


def cache_on(node: int, path: Path) -> None:
    def read() -> None:
        with open(path, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            LinuxKernel().read_range(f.fileno(), 0, os.fstat(f.fileno()).st_size)

    on_node(node, read)


def test_place_file_pages_moves_the_far_half(data_file: Path) -> None:
    home, far = NODES[0], NODES[1]
    cache_on(home, data_file)
    before = file_page_nodes(data_file)
    if set(before) != {home}:
        pytest.skip(f"the page cache of {data_file} cannot be placed here: {before}")
    heard: list[int] = []
    with open(data_file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        half = len(view) // 2 // mmap.PAGESIZE * mmap.PAGESIZE
        mv = memoryview(view)
        sides = [mv[:half]], [mv[half:]]
        got = place_file_pages(*sides, (home, far), topology=TOPOLOGY, kernel=LinuxKernel(),
                               on_move=heard.append)  # fmt: skip
        assert got.done and got.reason == NumaReason.PLACED and got.before == (1.0, 0.0)
        assert got.moved_bytes == len(view) - half and heard == [got.moved_bytes]
        assert got.after[0] >= 0.9 and got.after[1] >= 0.9
        assert set(page_nodes(sides[1][0])) == {far}
        again = place_file_pages(*sides, (home, far), topology=TOPOLOGY, kernel=LinuxKernel())
        assert again.reason == NumaReason.ALREADY_PLACED and again.moved_bytes == 0
        del sides
        mv.release()
