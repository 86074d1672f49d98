"""Binding a pool to NUMA nodes (hwpool._numa._bind) against fake machines and a fake kernel."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from fakes.numa import (
    CALLER,
    FakeKernel,
    FakePool,
    four_nodes,
    memory_only_node,
    plain_two_nodes,
    quota_two_nodes,
    single_node,
    smt_two_nodes,
)
from hwpool._host._topology import CPUTopology
from hwpool._numa._bind import NumaBinder
from hwpool._numa._results import NumaBinding, NumaReason, TwoNodes

NODE0_CORES = (0, 1, 2, 3)
NODE1_CORES = (4, 5, 6, 7)


def make(
    topology: CPUTopology, n: int, env: dict[str, str] | None = None
) -> tuple[NumaBinder, FakePool, FakeKernel]:
    kernel = FakeKernel()
    pool = FakePool(n, kernel)
    binder = NumaBinder(pool, topology=lambda: topology, kernel=kernel, environ=env or {})
    return binder, pool, kernel


def data_on(kernel: FakeKernel, node: int | None, pages: int = 64) -> np.ndarray:
    data = np.zeros(pages * 4096, dtype=np.uint8)
    kernel.place(data.ctypes.data, data.nbytes, node)
    return data


def test_bind_numa_binds_every_participant_to_the_data_node(tmp_path: Path) -> None:
    binder, pool, kernel = make(smt_two_nodes(tmp_path, range(16)), 4)
    data = data_on(kernel, 1)
    got = binder.bind([data])
    assert got == NumaBinding(1, NODE1_CORES, NumaReason.BOUND) and got.bound
    assert kernel.masks == {0: NODE1_CORES, 1: NODE1_CORES, 2: NODE1_CORES, CALLER: NODE1_CORES}
    assert binder.node == 1 and pool.runs == 1


def test_bind_numa_accepts_a_single_buffer_and_several(tmp_path: Path) -> None:
    binder, _pool, kernel = make(plain_two_nodes(tmp_path), 2)
    assert binder.bind(data_on(kernel, 0)).node == 0
    assert binder.bind([data_on(kernel, 1), data_on(kernel, 1)]).node == 1


def test_bind_numa_uses_smt_siblings_when_cores_are_too_few(tmp_path: Path) -> None:
    binder, _pool, kernel = make(smt_two_nodes(tmp_path, range(16)), 6)
    got = binder.bind([data_on(kernel, 0)])
    assert got.cpus == (0, 1, 2, 3, 8, 9, 10, 11)


@pytest.mark.parametrize(
    ("topology", "n", "reason"),
    [
        (plain_two_nodes, 5, NumaReason.TOO_FEW_CPUS),
        (single_node, 2, NumaReason.SINGLE_NODE),
    ],
)
def test_bind_numa_changes_nothing_when_it_cannot_bind(
    tmp_path: Path, topology: object, n: int, reason: NumaReason
) -> None:
    binder, pool, kernel = make(topology(tmp_path), n)  # type: ignore[operator]
    got = binder.bind([data_on(kernel, 0)])
    assert got.reason == reason and not got.bound
    assert kernel.masks == {} and pool.runs == 0 and binder.node is None


def test_bind_numa_gives_up_without_a_90_percent_node(tmp_path: Path) -> None:
    binder, pool, kernel = make(plain_two_nodes(tmp_path), 2)
    split = [data_on(kernel, 0, pages=80), data_on(kernel, 1, pages=20)]
    assert binder.bind(split) == NumaBinding(None, (), NumaReason.NO_MAJORITY)
    cold = data_on(kernel, 0)
    kernel.resident_pages.clear()
    assert binder.bind([cold]).reason == NumaReason.NOT_RESIDENT
    assert pool.runs == 0


def test_hwpool_numa_off_disables_every_binding(tmp_path: Path) -> None:
    binder, pool, kernel = make(plain_two_nodes(tmp_path), 2, {"HWPOOL_NUMA": "off"})
    assert binder.bind([data_on(kernel, 0)]).reason == NumaReason.DISABLED
    assert binder.bind_node(1).reason == NumaReason.DISABLED
    assert binder.bind_two_nodes(hint=0).reason == NumaReason.DISABLED
    assert binder.unbind_two_nodes().reason == NumaReason.NOT_TWO_NODES
    assert pool.runs == 0


def test_hwpool_numa_forces_a_node(tmp_path: Path) -> None:
    binder, _pool, kernel = make(four_nodes(tmp_path), 3, {"HWPOOL_NUMA": "node:2"})
    got = binder.bind([data_on(kernel, 0)])
    assert got == NumaBinding(2, (8, 9, 10, 11), NumaReason.FORCED)


def test_hwpool_numa_forcing_a_missing_node_is_an_error(tmp_path: Path) -> None:
    binder, pool, kernel = make(plain_two_nodes(tmp_path), 2, {"HWPOOL_NUMA": "node:5"})
    with pytest.raises(ValueError, match=r"HWPOOL_NUMA node must be one of .*got 5"):
        binder.bind([data_on(kernel, 0)])
    assert pool.runs == 0


@pytest.mark.parametrize("bad", [3, None, [b"ok", 5]])
def test_bind_numa_rejects_non_buffers_before_anything(tmp_path: Path, bad: object) -> None:
    binder, pool, _kernel = make(plain_two_nodes(tmp_path), 2)
    with pytest.raises(TypeError, match="buffers"):
        binder.bind(bad)
    assert pool.runs == 0


def test_bind_node_and_its_errors(tmp_path: Path) -> None:
    binder, pool, kernel = make(memory_only_node(tmp_path), 2)
    assert binder.bind_node(1) == NumaBinding(1, NODE1_CORES, NumaReason.REQUESTED)
    assert binder.bind_node(2) == NumaBinding(2, (), NumaReason.TOO_FEW_CPUS)  # no CPUs there
    with pytest.raises(ValueError, match=r"node must be one of the NUMA nodes \[0, 1, 2\], got 9"):
        binder.bind_node(9)
    with pytest.raises(TypeError, match=r"node must be an int, got '1' \(str\)"):
        binder.bind_node("1")  # type: ignore[arg-type]
    assert pool.runs == 1 and kernel.masks[CALLER] == NODE1_CORES


def test_quota_narrower_than_the_node_still_binds(tmp_path: Path) -> None:
    binder, _pool, kernel = make(quota_two_nodes(tmp_path), 2)
    assert binder.bind([data_on(kernel, 1)]).cpus == NODE1_CORES


def test_two_nodes_splits_odd_workers_to_the_far_node(tmp_path: Path) -> None:
    binder, _pool, kernel = make(smt_two_nodes(tmp_path, range(16)), 5)  # 4 workers + caller
    binder.bind([data_on(kernel, 1)])
    got = binder.bind_two_nodes()
    assert got == NumaBinding(
        1, NODE1_CORES, NumaReason.TWO_NODES, TwoNodes(home=1, far=0, n_home=3, n_far=2)
    )
    assert got.done and binder.two_nodes == TwoNodes(1, 0, 3, 2)
    assert kernel.masks == {
        0: NODE1_CORES, 1: NODE0_CORES, 2: NODE1_CORES, 3: NODE0_CORES, CALLER: NODE1_CORES
    }  # fmt: skip
    assert [binder.far_worker(w) for w in range(5)] == [False, True, False, True, False]
    home = (4, 5, 6, 7, 12, 13, 14, 15)  # 5 participants > 4 cores: the SMT siblings too
    assert binder.unbind_two_nodes() == NumaBinding(1, home, NumaReason.HOME)
    assert binder.two_nodes is None
    assert set(kernel.masks.values()) == {home}
    assert binder.unbind_two_nodes() == NumaBinding(1, home, NumaReason.NOT_TWO_NODES)
    assert not any(binder.far_worker(w) for w in range(5))


def test_two_nodes_from_a_hint_and_on_four_nodes(tmp_path: Path) -> None:
    binder, _pool, kernel = make(four_nodes(tmp_path), 3)
    assert binder.bind_two_nodes() == NumaBinding(None, (), NumaReason.NO_HOME_NODE)
    assert binder.bind_two_nodes(hint=2).two_nodes == TwoNodes(2, 0, 2, 1)
    assert kernel.masks == {0: (8, 9, 10, 11), 1: (0, 1, 2, 3), CALLER: (8, 9, 10, 11)}


def test_two_nodes_needs_a_far_worker_and_room(tmp_path: Path) -> None:
    binder, pool, _kernel = make(plain_two_nodes(tmp_path), 2)  # one worker: nobody is odd
    got = binder.bind_two_nodes(hint=0)
    assert got.reason == NumaReason.NO_FAR_WORKER and not got.done and got.two_nodes is None
    binder, pool, _kernel = make(plain_two_nodes(tmp_path), 11)  # 6 home > 4 CPUs
    assert binder.bind_two_nodes(hint=0).reason == NumaReason.TOO_FEW_CPUS and pool.runs == 0


def test_unbind_two_nodes_releases_when_home_is_too_small(tmp_path: Path) -> None:
    binder, _pool, kernel = make(plain_two_nodes(tmp_path), 7)  # 4 home + 3 far
    assert binder.bind_two_nodes(hint=1).two_nodes == TwoNodes(1, 0, 4, 3)
    assert binder.unbind_two_nodes() == NumaBinding(None, (), NumaReason.UNBOUND)
    assert set(kernel.masks.values()) == {tuple(range(8))} and binder.node is None


def test_two_nodes_bad_hint_and_far_worker_index(tmp_path: Path) -> None:
    binder, _pool, _kernel = make(plain_two_nodes(tmp_path), 3)
    with pytest.raises(ValueError, match="hint must be one of the NUMA nodes"):
        binder.bind_two_nodes(hint=4)
    for bad in (-1, 3):
        expected = rf"w must be a participant index in range\(3\), got {bad}"
        with pytest.raises(ValueError, match=expected):
            binder.far_worker(bad)
    for wrong in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="w must be an int"):
            binder.far_worker(wrong)  # type: ignore[arg-type]


def test_adopt_rebinds_a_new_calling_thread_once(tmp_path: Path) -> None:
    binder, _pool, kernel = make(plain_two_nodes(tmp_path), 1)
    binder.bind_node(0)
    kernel.masks.clear()
    binder._adopt()  # same thread, same generation: nothing to do
    assert kernel.masks == {}
    binder.bind_node(1)
    kernel.masks.clear()
    binder._adopt()
    assert kernel.masks == {}  # this thread adopted during the bind itself
    other = threading.Thread(target=binder._adopt)
    other.start()
    other.join(timeout=10)
    assert kernel.masks == {CALLER: NODE1_CORES}  # a thread new to the pool adopts the mask
