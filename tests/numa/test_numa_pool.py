"""CPUPool's NUMA binder (``pool.numa``): real worker threads, fake machine and kernel."""

from __future__ import annotations

import mmap
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from fakes.numa import FakeKernel, smt_two_nodes
from hwpool import CPUPool
from hwpool._host._topology import cpu_topology
from hwpool._numa._bind import NumaBinder
from hwpool._numa._results import NumaReason, TwoNodes

NODE0 = (0, 1, 2, 3)
NODE1 = (4, 5, 6, 7)


class ThreadKernel(FakeKernel):
    """Records each thread's mask by thread name instead of changing it."""

    def set_affinity(self, cpus: Iterable[int]) -> None:
        self.masks[threading.current_thread().name] = tuple(sorted(cpus))


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[tuple[CPUPool, ThreadKernel]]:
    topology = smt_two_nodes(tmp_path, range(16))
    kernel = ThreadKernel()
    with CPUPool(3) as team:  # 4 participants: one per physical core of a node
        team._numa = NumaBinder(team, topology=lambda: topology, kernel=kernel, environ={})
        yield team, kernel


def on_node(kernel: FakeKernel, node: int) -> np.ndarray:
    data = np.zeros(1 << 18, dtype=np.uint8)
    kernel.place(data.ctypes.data, data.nbytes, node)
    return data


def test_bind_numa_binds_the_workers_and_the_caller(pool: tuple[CPUPool, ThreadKernel]) -> None:
    team, kernel = pool
    got = team.numa.bind(on_node(kernel, 1))
    assert got.node == 1 and got.cpus == NODE1
    me = threading.current_thread().name
    assert set(kernel.masks) == {*(f"hwpool-cpu-{i}" for i in range(3)), me}
    assert set(kernel.masks.values()) == {got.cpus}


def test_two_nodes_on_real_workers(pool: tuple[CPUPool, ThreadKernel]) -> None:
    team, kernel = pool
    team.numa.bind_node(0)
    assert team.numa.bind_two_nodes().two_nodes == TwoNodes(0, 1, 3, 1)
    assert team.numa.two_nodes == TwoNodes(0, 1, 3, 1)
    assert kernel.masks["hwpool-cpu-1"] == NODE1
    assert kernel.masks["hwpool-cpu-0"] == kernel.masks["hwpool-cpu-2"] == NODE0
    assert kernel.masks[threading.current_thread().name] == NODE0
    assert [team.numa.far_worker(w) for w in range(4)] == [False, True, False, False]
    team.numa.unbind_two_nodes()
    assert team.numa.two_nodes is None and kernel.masks["hwpool-cpu-1"] == NODE0


def test_a_new_calling_thread_adopts_the_mask_at_its_dispatch(
    pool: tuple[CPUPool, ThreadKernel],
) -> None:
    team, kernel = pool
    team.numa.bind_node(1)
    other = threading.Thread(target=team.run, args=(lambda i, n: None,), name="other-caller")
    other.start()
    other.join(timeout=30)
    assert kernel.masks["other-caller"] == NODE1


def test_an_adopted_caller_is_not_rebound_at_each_dispatch(
    pool: tuple[CPUPool, ThreadKernel],
) -> None:
    team, kernel = pool
    team.numa.bind_node(1)
    kernel.masks.clear()
    team.run(lambda i, n: None)  # already adopted: no new mask for anybody
    assert kernel.masks == {}


# --- the real machine (one node here: every call is a no-op with its reason) -----------------


def test_real_pool_on_this_host_reports_its_decision() -> None:
    with CPUPool(1) as team:
        got = team.numa.bind([np.ones(1 << 16)])
        if len(cpu_topology().nodes) < 2:
            assert got.reason == NumaReason.SINGLE_NODE and not got.bound
            assert team.numa.bind_two_nodes(hint=0).reason == NumaReason.SINGLE_NODE
        assert team.numa.two_nodes is None
        assert not team.numa.far_worker(0) and not team.numa.far_worker(1)


def test_real_pool_rejects_bad_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with CPUPool(1) as team:
        with pytest.raises(TypeError, match="buffers must be a buffer or a list of buffers"):
            team.numa.bind(3)
        with pytest.raises(TypeError, match=r"buffers\[1\] must support the buffer protocol"):
            team.numa.bind([b"x", 3.5])
        with pytest.raises(ValueError, match="node must be one of the NUMA nodes"):
            team.numa.bind_node(1 << 20)
        with pytest.raises(ValueError, match=r"w must be a participant index in range\(2\)"):
            team.numa.far_worker(2)
        with pytest.raises(ValueError, match=r"home\[0\] must lie in a memory-mapped file"):
            team.numa.place_file_pages([np.ones(4096)], [], (0, 1))
        monkeypatch.setenv("HWPOOL_NUMA", "sometimes")
        with pytest.raises(ValueError, match="HWPOOL_NUMA must be 0, off, on or node:<n>"):
            team.numa.bind([b"x"])
        monkeypatch.setenv("HWPOOL_NUMA", "off")
        assert team.numa.bind([b"x"]).reason == NumaReason.DISABLED
        path = tmp_path / "f"
        path.write_bytes(bytes(8192))
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            got = team.numa.place_file_pages([view], [], (0, 1))
            assert got.reason == NumaReason.DISABLED and not got.done


def test_the_01_methods_on_the_pool_warn_and_keep_their_01_results(
    pool: tuple[CPUPool, ThreadKernel],
) -> None:
    team, kernel = pool
    calls = [
        ("bind_numa", lambda: team.bind_numa(on_node(kernel, 0)), NumaReason.BOUND),
        ("bind_node", lambda: team.bind_node(0), NumaReason.REQUESTED),
        ("bind_two_nodes", team.bind_two_nodes, TwoNodes(0, 1, 3, 1)),
        ("two_nodes", lambda: team.two_nodes, TwoNodes(0, 1, 3, 1)),
        ("far_worker", lambda: team.far_worker(1), True),
        ("unbind_two_nodes", team.unbind_two_nodes, None),
        ("bind_two_nodes", lambda: team.bind_two_nodes(hint=5), ValueError),
    ]
    for name, call, expected in calls:
        message = rf"CPUPool\.{name} is deprecated, use pool\.numa\."
        with pytest.warns(DeprecationWarning, match=message) as seen:
            if expected is ValueError:
                with pytest.raises(ValueError, match="hint must be one of the NUMA nodes"):
                    call()
                continue
            got = call()
        assert seen[0].filename == __file__  # the warning points at the caller's line
        assert getattr(got, "reason", got) == expected, name
    memory = [np.ones(4096)]
    with pytest.warns(DeprecationWarning, match="place_file_pages"), pytest.raises(ValueError):
        team.place_file_pages(memory, [], (0, 1))


FORK_CHILD = """
import os, select, sys, threading
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from fakes.numa import FakeKernel, smt_two_nodes
import hwpool
from hwpool._numa._bind import NumaBinder

class Blocking(FakeKernel):
    # The first set_affinity blocks, inside bind_node: the binder's lock is held meanwhile.
    def __init__(self):
        super().__init__()
        self.entered, self.release, self.first = threading.Event(), threading.Event(), True
    def set_affinity(self, cpus):
        if self.first:
            self.first = False
            self.entered.set()
            self.release.wait(30)

topology = smt_two_nodes(Path(sys.argv[2]), range(16))
kernel = Blocking()
pool = hwpool.CPUPool(1)
pool._numa = NumaBinder(pool, topology=lambda: topology, kernel=kernel, environ={})
binding = threading.Thread(target=pool.numa.bind_node, args=(1,))
binding.start()
assert kernel.entered.wait(30)
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: nobody will ever release the parent's locks here
    got = pool.numa.bind_node(0)
    os.write(write, str(got.reason.name).encode())
    os._exit(0)
ready, _, _ = select.select([read], [], [], 20)  # a bounded wait for the child's answer
answer = os.read(read, 100).decode() if ready else "hung"
if not ready:
    os.kill(pid, 9)
os.waitpid(pid, 0)
kernel.release.set()
binding.join(30)
pool.close()
print(answer)
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_gets_a_fresh_numa_lock(tmp_path: Path) -> None:
    tests = str(Path(__file__).resolve().parents[1])
    child = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FORK_CHILD, tests, str(tmp_path)],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip
    assert (child.returncode, child.stdout.strip()) == (0, "REQUESTED"), child.stderr[-2000:]


def test_creating_a_pool_loads_no_kernel_library() -> None:
    # pool.numa is created with the pool; libc (found by running ldconfig) only at first use.
    code = "import hwpool, hwpool._numa._pages as p; hwpool.CPUPool(1).close(); print(p._kernel)"
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False
    )
    assert (child.returncode, child.stdout.strip()) == (0, "None"), child.stderr[-2000:]
