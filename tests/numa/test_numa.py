"""Page sampling, the node and CPU decisions, and HWPOOL_NUMA parsing (hwpool._numa._pages)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hwpool
from fakes.numa import (
    PAGE,
    FakeKernel,
    four_nodes,
    memory_only_node,
    plain_two_nodes,
    quota_two_nodes,
    smt_two_nodes,
)
from hwpool._numa._kernel import LinuxKernel, buffer_span
from hwpool._numa._pages import (
    NumaMode,
    NumaReason,
    PageSample,
    _apportion,
    choose_cpus,
    choose_node,
    nodes_with_cpus,
    numa_mode,
    page_nodes,
    sample_pages,
    sample_span,
)

BASE = 0x7F00_0000_0000


# --- HWPOOL_NUMA -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "1", "on", "AUTO", " on "])
def test_numa_mode_auto(value: str | None) -> None:
    env = {} if value is None else {"HWPOOL_NUMA": value}
    assert numa_mode(env) == NumaMode(enabled=True, node=None)


@pytest.mark.parametrize("value", ["0", "off", "OFF"])
def test_numa_mode_off(value: str) -> None:
    assert numa_mode({"HWPOOL_NUMA": value}) == NumaMode(enabled=False)


def test_numa_mode_forced_node() -> None:
    assert numa_mode({"HWPOOL_NUMA": "node:3"}) == NumaMode(node=3)


@pytest.mark.parametrize(
    "value", ["node:", "node:-1", "node:x", "2", "yes", "node 1", "node:\u00b2", "node:\u0661"]
)
def test_numa_mode_rejects_garbage_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=r"HWPOOL_NUMA.*" + repr(value).replace("(", r"\(")):
        numa_mode({"HWPOOL_NUMA": value})


# --- sampling against the fake kernel ---------------------------------------------------


def test_sample_spreads_evenly_and_skips_non_resident_pages() -> None:
    kernel = FakeKernel()
    kernel.place(BASE, 50 * PAGE, 1)  # the first half of 100 pages is resident, on node 1
    got = sample_span(BASE, 100 * PAGE, sample=10, kernel=kernel)
    assert got == PageSample(sampled=10, resident=5, nodes={1: 5})
    assert kernel.queried == [BASE + i * 10 * PAGE for i in range(5)]
    assert kernel.touched == kernel.queried


def test_pages_that_cannot_be_read_are_not_counted_as_resident() -> None:
    kernel = FakeKernel()
    kernel.place(BASE, 4 * PAGE, 1)
    kernel.unreadable = {BASE + 2 * PAGE, BASE + 3 * PAGE}  # past the end of a truncated file
    got = sample_span(BASE, 4 * PAGE, sample=4, kernel=kernel)
    assert got == PageSample(sampled=4, resident=2, nodes={1: 2})
    assert kernel.queried == [BASE, BASE + PAGE]


def test_sample_takes_every_page_of_a_small_unaligned_span() -> None:
    kernel = FakeKernel()
    kernel.place(BASE, 3 * PAGE, 0)
    got = sample_span(BASE + 100, 2 * PAGE, sample=64, kernel=kernel)  # straddles 3 pages
    assert got == PageSample(sampled=3, resident=3, nodes={0: 3})


def test_sample_counts_resident_pages_whose_node_is_unknown() -> None:
    kernel = FakeKernel()
    kernel.place(BASE, 4 * PAGE, None)
    kernel.place(BASE + 4 * PAGE, 4 * PAGE, 0)
    assert sample_span(BASE, 8 * PAGE, sample=8, kernel=kernel) == PageSample(8, 8, {0: 4})


def test_move_pages_refused_falls_back_to_numa_maps() -> None:
    kernel = FakeKernel()
    kernel.refuse_move_pages = True
    kernel.place(BASE, 100 * PAGE, 1)
    other = BASE + 100 * PAGE
    kernel.place(other, 10 * PAGE, 0)
    kernel.proc["maps"] = (
        f"{BASE:x}-{BASE + 100 * PAGE:x} r--s 00000000 fd:01 12 /data/w.bin\n"
        f"{other:x}-{other + 10 * PAGE:x} rw-p 00000000 00:00 0\n"
    )
    kernel.proc["numa_maps"] = (
        f"{BASE:x} default file=/data/w.bin mapped=100 N0=25 N1=75 kernelpagesize_kB=4\n"
        f"{other:x} default anon=10 dirty=10 N0=10 kernelpagesize_kB=4\n"
    )
    got = sample_span(BASE, 110 * PAGE, sample=110, kernel=kernel)
    # 100 pages shared 25:75 between nodes 0 and 1, plus the 10 anonymous ones on node 0.
    assert got == PageSample(110, 110, {0: 35, 1: 75})


def test_move_pages_refused_and_numa_maps_missing_reports_nothing() -> None:
    kernel = FakeKernel()
    kernel.refuse_move_pages = True
    kernel.proc["numa_maps"] = None
    kernel.place(BASE, 8 * PAGE, 0)
    assert sample_span(BASE, 8 * PAGE, sample=8, kernel=kernel) == PageSample(8, 8, {})


def test_apportion_keeps_the_total_and_breaks_ties_by_node() -> None:
    assert _apportion({0: 1, 1: 1, 2: 1}, 10) == {0: 4, 1: 3, 2: 3}
    assert _apportion({3: 0}, 5) == {}


def test_sample_pages_of_a_real_buffer_uses_its_address() -> None:
    data = np.zeros(8 * PAGE, dtype=np.uint8)
    kernel = FakeKernel()
    kernel.place(data.ctypes.data, data.nbytes, 1)
    got = sample_pages(data, kernel=kernel)
    assert got.nodes == {1: got.sampled} and got.sampled in (8, 9)


@pytest.mark.parametrize("bad", [3, "text", None, object()])
def test_page_nodes_rejects_a_non_buffer(bad: object) -> None:
    with pytest.raises(TypeError, match="buffer must support the buffer protocol"):
        page_nodes(bad)


def test_page_nodes_rejects_strided_buffers_and_bad_sample() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        page_nodes(np.zeros((4, 4))[:, 1])
    with pytest.raises(ValueError, match="sample must be >= 1, got 0"):
        page_nodes(b"x", sample=0)
    for bad in ("3", 2.0, True):
        with pytest.raises(TypeError, match="sample must be an int"):
            page_nodes(b"x", sample=bad)  # type: ignore[arg-type]


def test_buffer_span_accepts_fortran_ordered_arrays() -> None:
    weights = np.ones((64, 128), dtype=np.float32)
    assert buffer_span(weights.T) == (weights.ctypes.data, weights.nbytes)
    assert buffer_span(memoryview(weights.T)) == (weights.ctypes.data, weights.nbytes)
    fortran = np.asfortranarray(weights)
    assert buffer_span(fortran) == (fortran.ctypes.data, fortran.nbytes)
    assert page_nodes(weights.T, sample=4) == page_nodes(weights, sample=4)


def test_buffer_span_reads_read_only_buffers() -> None:
    data = np.arange(100)
    data.flags.writeable = False
    assert buffer_span(data) == (data.ctypes.data, data.nbytes)
    assert buffer_span(b"") == (0, 0)


# --- the 90% rule -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        (PageSample(100, 100, {1: 90, 0: 10}), (1, NumaReason.BOUND)),
        (PageSample(100, 100, {1: 89, 0: 11}), (None, NumaReason.NO_MAJORITY)),
        (PageSample(100, 50, {0: 45}), (0, NumaReason.BOUND)),
        (PageSample(100, 49, {0: 49}), (None, NumaReason.NOT_RESIDENT)),
        (PageSample(100, 100, {}), (None, NumaReason.NO_MAJORITY)),
        (PageSample(), (None, NumaReason.NOT_RESIDENT)),
    ],
)
def test_choose_node(sample: PageSample, expected: tuple[int | None, NumaReason]) -> None:
    assert choose_node(sample) == expected


def test_samples_merge() -> None:
    merged = PageSample(10, 8, {0: 8}) + PageSample(5, 5, {0: 1, 1: 4})
    assert merged == PageSample(15, 13, {0: 9, 1: 4})


# --- CPU choice on fake machines -----------------------------------------------------------


def test_choose_cpus_two_nodes_with_smt(tmp_path: Path) -> None:
    topo = smt_two_nodes(tmp_path, affinity=range(16))
    assert choose_cpus(topo, 0, 4) == (0, 1, 2, 3)  # physical cores only
    assert choose_cpus(topo, 1, 2) == (4, 5, 6, 7)  # the set, not one core per thread
    assert choose_cpus(topo, 1, 5) == (4, 5, 6, 7, 12, 13, 14, 15)  # needs the siblings
    assert choose_cpus(topo, 0, 9) is None  # never narrower than the pool


def test_choose_cpus_follows_the_affinity(tmp_path: Path) -> None:
    topo = smt_two_nodes(tmp_path, affinity=[1, 2, 8, 9, 4])
    assert choose_cpus(topo, 0, 2) == (1, 2, 8)  # core (0, 8): 8 is its first usable thread
    assert choose_cpus(topo, 0, 4) == (1, 2, 8, 9)
    assert choose_cpus(topo, 1, 2) is None


def test_choose_cpus_two_nodes_without_smt(tmp_path: Path) -> None:
    topo = plain_two_nodes(tmp_path)
    assert choose_cpus(topo, 1, 4) == (4, 5, 6, 7)
    assert choose_cpus(topo, 1, 5) is None


def test_choose_cpus_four_nodes(tmp_path: Path) -> None:
    topo = four_nodes(tmp_path)
    assert [choose_cpus(topo, n, 3) for n in range(4)] == [
        (0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)
    ]  # fmt: skip


def test_memory_only_node_has_no_cpus_to_offer(tmp_path: Path) -> None:
    topo = memory_only_node(tmp_path)
    assert nodes_with_cpus(topo) == [0, 1]
    assert choose_cpus(topo, 2, 1) is None


def test_a_quota_narrower_than_the_node_does_not_narrow_the_set(tmp_path: Path) -> None:
    topo = quota_two_nodes(tmp_path)
    assert topo.cgroup_quota == 2.0
    assert choose_cpus(topo, 0, 2) == (0, 1, 2, 3)


def test_choose_cpus_rejects_an_unknown_node(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"node must be one of the NUMA nodes \[0, 1\], got 7"):
        choose_cpus(plain_two_nodes(tmp_path), 7, 1)


# --- the real kernel on this machine ---------------------------------------------------------

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


@linux_only
def test_page_nodes_of_a_resident_array_are_known() -> None:
    data = np.ones(1 << 20)  # 8 MiB, written so every page is resident
    got = page_nodes(data, sample=256)
    nodes = {node.id for node in hwpool.cpu_topology().nodes}
    assert sum(got.values()) == 256  # every sampled page is resident and its node known
    assert set(got) <= nodes
    if nodes == {0}:
        assert got == {0: 256}


TRUNCATED_CHILD = """
import mmap, os, sys
import hwpool
path = sys.argv[1]
with open(path, "wb") as f:
    f.write(bytes([1]) * (64 * mmap.PAGESIZE))
with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as view:
    assert sum(view[i] for i in range(0, len(view), mmap.PAGESIZE)) == 64  # pages read in
    os.truncate(path, mmap.PAGESIZE)  # 63 pages now lie past the end of the file
    with memoryview(view) as whole, whole[-8:] as tail:
        print(sum(hwpool.page_nodes(whole).values()), sum(hwpool.page_nodes(tail).values()))
"""


@linux_only
def test_page_nodes_of_a_truncated_shared_file_mapping_does_not_crash(tmp_path: Path) -> None:
    # In a child: a load of a page past the end of the file is SIGBUS, which would kill pytest.
    child = subprocess.run(
        [sys.executable, "-c", TRUNCATED_CHILD, str(tmp_path / "shrunk.bin")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert child.returncode == 0, f"child died ({child.returncode}): {child.stderr[-2000:]}"
    whole, tail = map(int, child.stdout.split())
    assert whole <= 1 and tail == 0  # only the page still inside the file can be counted


@linux_only
def test_page_nodes_of_an_untouched_mapping_of_a_dropped_file_is_empty(tmp_path: Path) -> None:
    given = os.environ.get("HWPOOL_NUMA_TEST_FILE")  # a disk-backed file (the VM's /tmp is not)
    path = Path(given) if given else tmp_path / "cold.bin"
    if not given:
        path.write_bytes(os.urandom(64 * PAGE))
    with open(path, "rb") as f:
        if not given:
            os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            start, length = buffer_span(view)
            if any(b & 1 for b in LinuxKernel().resident(start, length)):
                pytest.skip("this filesystem keeps the file cached (tmpfs?)")
            assert page_nodes(view) == {}
            assert not any(b & 1 for b in LinuxKernel().resident(start, length))  # not read in
