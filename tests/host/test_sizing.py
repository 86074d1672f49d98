"""effective_threads(), set_threads(), HWPOOL_THREADS and HWPOOL_SPIN against fake machines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import hwpool
from fakes.sysfs import (
    FakeSys,
    big_little_phone,
    container_with_quota,
    intel_hybrid_desktop,
    two_socket_smt_host,
)
from hwpool import cpu_topology, effective_threads, set_threads
from hwpool._host._sizing import DEFAULT_SPIN, spin_from_env

NO_ENV: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _clear_forced() -> Iterator[None]:
    set_threads(None)
    yield
    set_threads(None)


def team(root: Path, affinity: range | list[int], env: dict[str, str] = NO_ENV) -> int:
    return effective_threads(topology=cpu_topology(root, affinity=affinity), environ=env)


def test_two_socket_smt_host_uses_every_hardware_thread(tmp_path: Path) -> None:
    two_socket_smt_host(tmp_path)
    assert team(tmp_path, range(16)) == 16
    assert team(tmp_path, [0, 8]) == 2


def test_big_little_phone_uses_its_big_cores(tmp_path: Path) -> None:
    big_little_phone(tmp_path)
    assert team(tmp_path, range(8)) == 4


def test_big_cores_outside_the_affinity_mask_do_not_count(tmp_path: Path) -> None:
    big_little_phone(tmp_path)
    assert team(tmp_path, [0, 5, 6]) == 2
    # Pinned to little cores only: those are what the process has.
    assert team(tmp_path, [0, 1, 2]) == 3


def test_intel_hybrid_uses_p_core_threads(tmp_path: Path) -> None:
    intel_hybrid_desktop(tmp_path)
    assert team(tmp_path, range(24)) == 16


def test_cgroup_quota_caps_big_cores(tmp_path: Path) -> None:
    intel_hybrid_desktop(tmp_path).cgroup_v2("400000 100000")
    assert team(tmp_path, range(24)) == 4


def test_container_with_fractional_quota_rounds_up(tmp_path: Path) -> None:
    container_with_quota(tmp_path, "150000 100000")
    assert team(tmp_path, range(4)) == 2


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    FakeSys(tmp_path).cpus(range(8)).cgroup_v1("300000", "100000", path="/job")
    assert team(tmp_path, range(8)) == 3


def test_missing_files_give_the_affinity_mask(tmp_path: Path) -> None:
    assert team(tmp_path, [0, 1, 2]) == 3


def test_env_overrides_topology(tmp_path: Path) -> None:
    big_little_phone(tmp_path)
    assert team(tmp_path, range(8), {"HWPOOL_THREADS": "7"}) == 7


def test_set_threads_overrides_env_and_none_clears(tmp_path: Path) -> None:
    big_little_phone(tmp_path)
    set_threads(3)
    assert team(tmp_path, range(8), {"HWPOOL_THREADS": "7"}) == 3
    set_threads(None)
    assert team(tmp_path, range(8), {"HWPOOL_THREADS": "7"}) == 7


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "", " 4", "4.0", "\uff12"])
def test_bad_hwpool_threads_names_variable_and_value(tmp_path: Path, raw: str) -> None:
    with pytest.raises(ValueError, match=r"HWPOOL_THREADS.*" + repr(raw).replace("\\", "\\\\")):
        team(tmp_path, [0], {"HWPOOL_THREADS": raw})


@pytest.mark.parametrize(
    ("bad", "error"), [(0, ValueError), (-2, ValueError), ("2", TypeError), (True, TypeError)]
)
def test_bad_set_threads_changes_nothing(tmp_path: Path, bad: object, error: type) -> None:
    set_threads(5)
    with pytest.raises(error, match="n must"):
        set_threads(bad)  # type: ignore[arg-type]
    assert team(tmp_path, [0]) == 5


def test_live_machine_reports_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPOOL_THREADS", raising=False)
    assert effective_threads() == cpu_topology().usable
    monkeypatch.setenv("HWPOOL_THREADS", "9")
    assert effective_threads() == 9


def test_from_env_sizes_the_pool() -> None:
    set_threads(1)
    assert hwpool.CPUPool.from_env() is None
    set_threads(3)
    pool = hwpool.CPUPool.from_env()
    assert pool is not None
    with pool:
        assert (pool.n_workers, pool.n_participants) == (2, 3)


def test_spin_from_env() -> None:
    assert spin_from_env({}) == DEFAULT_SPIN
    assert spin_from_env({"HWPOOL_SPIN": "0"}) == 0
    assert spin_from_env({"HWPOOL_SPIN": "5000"}) == 5000


def test_set_threads_takes_numpy_integers(tmp_path: Path) -> None:
    set_threads(np.int64(4))  # type: ignore[arg-type]
    assert team(tmp_path, [0]) == 4 and type(team(tmp_path, [0])) is int


@pytest.mark.parametrize("raw", ["-1", "x", "", "1e3", "\u00b2", "\u0663", " 5"])
def test_bad_hwpool_spin_names_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="HWPOOL_SPIN"):
        spin_from_env({"HWPOOL_SPIN": raw})


def test_pool_reads_hwpool_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPOOL_SPIN", "7")
    with hwpool.CPUPool(1) as pool:
        assert pool.spin == 7
    monkeypatch.setenv("HWPOOL_SPIN", "nope")
    with pytest.raises(ValueError, match="HWPOOL_SPIN"):
        hwpool.CPUPool(1)
