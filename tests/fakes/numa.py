"""A fake kernel and a fake pool for the NUMA tests, plus fake machines built with FakeSys.

``FakeKernel`` keeps page residency and placement in dicts keyed by page address and answers
the :class:`hwpool._numa._kernel.Kernel` calls from them; file reads and drops are mapped back to
addresses through ``map_file``. ``FakePool`` runs each participant's share in the calling
thread with ``kernel.who`` set, so the masks each participant set are recorded per index.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fakes.sysfs import FakeSys, two_socket_smt_host
from hwpool._host._topology import CPUTopology, cpu_topology

PAGE = 4096
CALLER = "caller"


class FakeKernel:
    """Pages: ``resident`` set and ``node_of`` map; see the module docstring."""

    page_size = PAGE

    def __init__(self, cpu_node: dict[int, int] | None = None) -> None:
        self.resident_pages: set[int] = set()
        self.node_of: dict[int, int] = {}
        self.refuse_move_pages = False
        self.proc: dict[str, str | None] = {}
        self.queried: list[int] = []
        self.touched: list[int] = []
        self.unreadable: set[int] = set()  # resident for mincore, but reading them fails
        self.unmapped: list[tuple[int, int]] = []
        self.masks: dict[object, tuple[int, ...]] = {}
        self.who: object = CALLER
        self.cpu_node = cpu_node or {}
        self.files: dict[int, int] = {}  # inode -> address where offset 0 is mapped
        self.reads: list[tuple[int, int, int]] = []  # (node, offset, length)
        self._thread = threading.local()

    def place(self, addr: int, length: int, node: int | None) -> None:
        """Make the pages of a span resident on ``node`` (None: resident, node unknown)."""
        for page in range(addr - addr % PAGE, addr + length, PAGE):
            self.resident_pages.add(page)
            if node is None:
                self.node_of.pop(page, None)
            else:
                self.node_of[page] = node

    def map_file(self, addr: int, path: str | os.PathLike[str]) -> None:
        self.files[os.stat(path).st_ino] = addr

    def resident(self, addr: int, length: int) -> bytes:
        first = addr - addr % PAGE
        return bytes(int(p in self.resident_pages) for p in range(first, addr + length, PAGE))

    def touch(self, addrs: Sequence[int]) -> list[int]:
        self.touched.extend(addrs)
        return [a for a in addrs if a not in self.unreadable]

    def page_nodes(self, addrs: Sequence[int]) -> list[int]:
        if self.refuse_move_pages:
            raise PermissionError(errno.EPERM, "move_pages: refused by seccomp")
        self.queried.extend(addrs)
        return [self.node_of.get(a, -errno.ENOENT) for a in addrs]

    def read_proc(self, name: str) -> str | None:
        if name in self.proc:
            return self.proc[name]
        with open(f"/proc/self/{name}") as f:
            return f.read()

    def set_affinity(self, cpus: Iterable[int]) -> None:
        self.masks[self.who] = self._thread.mask = tuple(sorted(cpus))

    def drop_cached(self, fd: int, offset: int, length: int) -> None:
        base = self.files[os.fstat(fd).st_ino]
        for page in range(base + offset, base + offset + length, PAGE):
            self.resident_pages.discard(page)
            self.node_of.pop(page, None)

    def unmap_pages(self, addr: int, length: int) -> None:
        self.unmapped.append((addr, length))

    def read_range(self, fd: int, offset: int, length: int) -> None:
        node = self.cpu_node[min(self._thread.mask)]  # the reading thread's own mask
        self.reads.append((node, offset, length))
        self.place(self.files[os.fstat(fd).st_ino] + offset, length, node)


class FakePool:
    """``n_participants`` participants run one after the other in the calling thread."""

    def __init__(self, n_participants: int, kernel: FakeKernel) -> None:
        self.n_participants = n_participants
        self.kernel = kernel
        self.runs = 0

    def run(self, f: Callable[[int, int], object]) -> None:
        self.runs += 1
        for index in range(self.n_participants):
            self.kernel.who = index if index < self.n_participants - 1 else CALLER
            f(index, self.n_participants)
        self.kernel.who = CALLER


def cpu_nodes(topology: CPUTopology) -> dict[int, int]:
    return {cpu: node.id for node in topology.nodes for cpu in node.cpus}


def smt_two_nodes(root: Path, affinity: Iterable[int] | None = None) -> CPUTopology:
    """node0 = 0-3 + siblings 8-11, node1 = 4-7 + siblings 12-15."""
    two_socket_smt_host(root)
    return cpu_topology(root, affinity=affinity)


def plain_two_nodes(root: Path) -> CPUTopology:
    """node0 = 0-3, node1 = 4-7, no SMT."""
    FakeSys(root).cpus(range(8)).node(0, range(4)).node(1, range(4, 8))
    return cpu_topology(root, affinity=range(8))


def four_nodes(root: Path) -> CPUTopology:
    """Four nodes of four CPUs each."""
    fake = FakeSys(root).cpus(range(16))
    for node in range(4):
        fake.node(node, range(4 * node, 4 * node + 4))
    return cpu_topology(root, affinity=range(16))


def memory_only_node(root: Path) -> CPUTopology:
    """node0 = 0-3, node1 = 4-7, node2 has memory but no CPU (CXL-style)."""
    FakeSys(root).cpus(range(8)).node(0, range(4)).node(1, range(4, 8)).node(2, [])
    return cpu_topology(root, affinity=range(8))


def quota_two_nodes(root: Path) -> CPUTopology:
    """The SMT two-node host seen from a container whose quota is 2 CPUs."""
    two_socket_smt_host(root).cgroup_v2("200000 100000")
    return cpu_topology(root, affinity=range(16))


def single_node(root: Path) -> CPUTopology:
    FakeSys(root).cpus(range(4)).node(0, range(4))
    return cpu_topology(root, affinity=range(4))
