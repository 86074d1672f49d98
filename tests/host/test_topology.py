"""cpu_topology() against fake sysfs/procfs/cgroupfs trees, and on the real machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakes.sysfs import (
    FakeSys,
    big_little_phone,
    container_with_quota,
    cpu_list,
    intel_hybrid_desktop,
    two_socket_smt_host,
)
from hwpool import CPUTopology, NumaNode, cpu_topology
from hwpool._host._topology import parse_cpu_list


def test_parse_cpu_list_ranges_and_singles() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list("5,1,1") == (1, 5)
    assert parse_cpu_list("\n") == ()


@pytest.mark.parametrize("text", ["0-", "a", "3-1", "1,,x", "-2", "\u00b2", "0-\u0663"])
def test_parse_cpu_list_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="CPU list"):
        parse_cpu_list(text)


def test_fake_cpu_list_round_trips() -> None:
    cpus = (0, 1, 2, 5, 7, 8, 9)
    assert cpu_list(cpus) == "0-2,5,7-9"
    assert parse_cpu_list(cpu_list(cpus)) == cpus


def test_two_socket_smt_host(tmp_path: Path) -> None:
    two_socket_smt_host(tmp_path)
    topo = cpu_topology(tmp_path, affinity=range(16))
    assert topo.online == tuple(range(16))
    assert topo.nodes == (
        NumaNode(0, (0, 1, 2, 3, 8, 9, 10, 11)),
        NumaNode(1, (4, 5, 6, 7, 12, 13, 14, 15)),
    )
    assert topo.smt_groups == tuple((i, i + 8) for i in range(8))
    assert topo.big_cores == ()
    assert topo.cgroup_quota is None
    assert topo.usable == 16


def test_affinity_limits_usable_and_is_sorted(tmp_path: Path) -> None:
    two_socket_smt_host(tmp_path)
    topo = cpu_topology(tmp_path, affinity=[9, 1, 3, 1])
    assert topo.affinity == (1, 3, 9)
    assert topo.usable == 3


def test_big_little_phone_by_capacity(tmp_path: Path) -> None:
    big_little_phone(tmp_path)
    topo = cpu_topology(tmp_path, affinity=range(8))
    assert topo.big_cores == (4, 5, 6, 7)
    assert topo.usable == 8


def test_big_cores_fall_back_to_max_frequency(tmp_path: Path) -> None:
    freqs = {**dict.fromkeys(range(4), 1_800_000), **dict.fromkeys(range(4, 6), 2_900_000)}
    FakeSys(tmp_path).cpus(range(6)).max_freq(freqs)
    assert cpu_topology(tmp_path, affinity=range(6)).big_cores == (4, 5)


def test_big_core_threshold_is_five_eighths_of_the_largest(tmp_path: Path) -> None:
    # 640/1024 is exactly 5/8 (big); 639 is just under (little).
    FakeSys(tmp_path).cpus(range(3)).capacity({0: 639, 1: 640, 2: 1024})
    assert cpu_topology(tmp_path, affinity=range(3)).big_cores == (1, 2)


def test_capacity_wins_over_frequency(tmp_path: Path) -> None:
    fake = FakeSys(tmp_path).cpus(range(2)).capacity({0: 1024, 1: 1024})
    fake.max_freq({0: 3_000_000, 1: 1_000_000})
    assert cpu_topology(tmp_path, affinity=range(2)).big_cores == ()


def test_partial_capacity_files_mean_unknown(tmp_path: Path) -> None:
    FakeSys(tmp_path).cpus(range(2)).capacity({0: 100})
    assert cpu_topology(tmp_path, affinity=range(2)).big_cores == ()


def test_intel_hybrid_uses_cpu_core_list(tmp_path: Path) -> None:
    intel_hybrid_desktop(tmp_path)
    topo = cpu_topology(tmp_path, affinity=range(24))
    assert topo.big_cores == tuple(range(16))
    assert topo.smt_groups[0] == (0, 1)
    assert (16,) in topo.smt_groups


def test_intel_hybrid_without_atoms_is_homogeneous(tmp_path: Path) -> None:
    FakeSys(tmp_path).cpus(range(4)).hybrid(core=range(4), atom=[])
    assert cpu_topology(tmp_path, affinity=range(4)).big_cores == ()


def test_container_with_fractional_quota(tmp_path: Path) -> None:
    container_with_quota(tmp_path)
    topo = cpu_topology(tmp_path, affinity=range(4))
    assert topo.cgroup_quota == 1.5
    assert topo.usable == 2


@pytest.mark.parametrize(
    ("cpu_max", "quota"),
    [
        ("max 100000", None),
        ("", None),
        ("garbage", None),
        ("50000 100000", 0.5),
        ("1 0", None),
        ("\u00b2 100000", None),
        ("50000 \u0661", None),
    ],
)
def test_cgroup_v2_cpu_max_contents(tmp_path: Path, cpu_max: str, quota: float | None) -> None:
    container_with_quota(tmp_path, cpu_max)
    topo = cpu_topology(tmp_path, affinity=range(4))
    assert topo.cgroup_quota == quota
    assert topo.usable == (4 if quota is None else 1)


def test_cgroup_v2_ancestor_limit_applies(tmp_path: Path) -> None:
    fake = FakeSys(tmp_path).cpus(range(8))
    fake.cgroup_v2("max 100000", path="/a/b", ancestors={"/a": "300000 100000"})
    topo = cpu_topology(tmp_path, affinity=range(8))
    assert topo.cgroup_quota == 3.0
    assert topo.usable == 3


def test_cgroup_v2_without_mountinfo_uses_default_mount(tmp_path: Path) -> None:
    FakeSys(tmp_path).cpus(range(4)).cgroup_v2("200000 100000", mountinfo=False)
    assert cpu_topology(tmp_path, affinity=range(4)).cgroup_quota == 2.0


@pytest.mark.parametrize(
    ("quota_us", "period_us", "quota"),
    [
        ("250000", "100000", 2.5),
        ("-1", "100000", None),
        ("", "100000", None),
        ("250000", None, None),
        (None, "100000", None),
    ],
)
def test_cgroup_v1_cfs_files(
    tmp_path: Path, quota_us: str | None, period_us: str | None, quota: float | None
) -> None:
    FakeSys(tmp_path).cpus(range(8)).cgroup_v1(quota_us, period_us, path="/docker/abc")
    assert cpu_topology(tmp_path, affinity=range(8)).cgroup_quota == quota


def test_cgroup_v1_container_mount_root_is_stripped(tmp_path: Path) -> None:
    FakeSys(tmp_path).cpus(range(8)).cgroup_v1(
        "150000", path="/docker/abc", mount_root="/docker/abc"
    )
    topo = cpu_topology(tmp_path, affinity=range(8))
    assert topo.cgroup_quota == 1.5
    assert topo.usable == 2


def test_cgroup_v1_without_mountinfo_uses_default_mount(tmp_path: Path) -> None:
    FakeSys(tmp_path).cpus(range(8)).cgroup_v1("100000", mountinfo=False)
    assert cpu_topology(tmp_path, affinity=range(8)).cgroup_quota == 1.0


def test_missing_files_fall_back_without_crashing(tmp_path: Path) -> None:
    topo = cpu_topology(tmp_path, affinity=[0])
    count = os.cpu_count() or 1
    assert topo.online == tuple(range(count))
    assert topo.nodes == (NumaNode(0, topo.online),)
    assert topo.smt_groups == tuple((c,) for c in topo.online)
    assert (topo.big_cores, topo.cgroup_quota, topo.usable) == ((), None, 1)


def test_malformed_sysfs_files_are_ignored(tmp_path: Path) -> None:
    fake = FakeSys(tmp_path).cpus(range(2))
    fake.write("sys/devices/system/node/node0/cpulist", "zz").capacity({1: 5})
    fake.write("sys/devices/system/cpu/cpu0/cpu_capacity", "x")
    fake.write("sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "?")
    topo = cpu_topology(tmp_path, affinity=range(2))
    assert topo.nodes == (NumaNode(0, (0, 1)),)
    assert topo.smt_groups == ((0,), (1,))
    assert topo.big_cores == ()


def test_offline_cpus_are_left_out_of_nodes_and_groups(tmp_path: Path) -> None:
    FakeSys(tmp_path).cpus([0, 1, 2]).node(0, range(4)).smt((0, 3), (1, 2))
    topo = cpu_topology(tmp_path, affinity=[0, 1, 2])
    assert topo.nodes == (NumaNode(0, (0, 1, 2)),)
    assert topo.smt_groups == ((0,), (1, 2))


@pytest.mark.parametrize(
    ("bad", "error"),
    [([], ValueError), ([-1], ValueError), (["0"], TypeError), ([True], TypeError),
     ([1.0], TypeError)],
)  # fmt: skip
def test_bad_affinity_is_rejected(tmp_path: Path, bad: list[object], error: type) -> None:
    with pytest.raises(error, match="affinity"):
        cpu_topology(tmp_path, affinity=bad)  # type: ignore[arg-type]


def test_real_machine_matches_the_os() -> None:
    topo = cpu_topology()
    assert isinstance(topo, CPUTopology)
    if hasattr(os, "sched_getaffinity"):
        assert topo.affinity == tuple(sorted(os.sched_getaffinity(0)))
    assert 1 <= topo.usable <= len(topo.affinity)
    assert sorted(c for node in topo.nodes for c in node.cpus) == sorted(topo.online)


def test_topology_is_frozen(tmp_path: Path) -> None:
    topo = cpu_topology(tmp_path, affinity=[0])
    with pytest.raises(AttributeError):
        topo.usable = 5  # type: ignore[misc]
