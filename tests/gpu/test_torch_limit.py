"""``hwpool.torch_limit()`` caps PyTorch's allocator at the lease's share of each GPU.

A fake ``torch`` (tests/fakes/torch_pkg) records the calls it receives; the jobs are real child
processes started by real leases (``lease.run``), in-process and over a real host server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwpool
from hostserver import MakePool
from hwpool import GPUPool

FAKE_TORCH = Path(__file__).resolve().parents[1] / "fakes" / "torch_pkg"
SOURCE = Path(hwpool.__file__).resolve().parents[1]
LIMIT = "import hwpool, json; print(json.dumps(hwpool.torch_limit()))"


def calls(log: Path) -> list[list[object]]:
    """The calls the fake torch received: ``[fraction, device]`` each."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def child_env(log: Path) -> dict[str, str]:
    """A child's environment with the fake torch and this checkout's hwpool first."""
    return {**os.environ, "PYTHONPATH": f"{FAKE_TORCH}:{SOURCE}", "FAKE_TORCH_CALLS": str(log)}


def run_limit(lease: hwpool.GPULease, log: Path) -> subprocess.CompletedProcess[str]:
    """``torch_limit()`` in a child started on ``lease``."""
    return lease.run(
        [sys.executable, "-c", LIMIT], env=child_env(log), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_a_leased_child_caps_torch_at_its_fraction(make_pool: MakePool, tmp_path: Path) -> None:
    pool = make_pool(2)
    log = tmp_path / "calls"
    with pool.lease(1.0):
        lease = pool.lease(0.25)
        with lease:
            done = run_limit(lease, log)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"0": 0.25}  # the child sees its one GPU as device 0
    assert calls(log) == [[0.25, 0]]


def test_a_memory_lease_caps_torch_at_its_mib_over_the_total(tmp_path: Path) -> None:
    pool = GPUPool(gpu_memory=["40GiB"])
    log = tmp_path / "calls"
    lease = pool.lease(memory="10GiB")
    with lease:
        done = run_limit(lease, log)
    assert done.returncode == 0, done.stderr
    assert calls(log) == [[0.25, 0]]


def test_whole_gpus_set_nothing(tmp_path: Path) -> None:
    pool = GPUPool(2)
    log = tmp_path / "calls"
    lease = pool.lease_full(2)
    with lease:
        done = run_limit(lease, log)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {} and calls(log) == []


def test_in_process_it_caps_the_leases_own_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(FAKE_TORCH))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv("FAKE_TORCH_CALLS", str(tmp_path / "calls"))
    pool = GPUPool(2)
    with pool.lease(1.0):
        lease = pool.lease(0.5)
        with lease:
            assert hwpool.torch_limit(lease) == {1: 0.5}  # the pool's GPU 1
    assert calls(tmp_path / "calls") == [[0.5, 1]]


def test_no_lease_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HWPOOL_LEASE", raising=False)
    with pytest.raises(RuntimeError, match=r"holds no lease \(HWPOOL_LEASE is not set"):
        hwpool.torch_limit()
    lease = GPUPool(1).lease(0.5)
    with pytest.raises(RuntimeError, match="holds no GPU"):
        hwpool.torch_limit(lease)


@pytest.mark.parametrize(
    "text", ["not json", "[1]", '{"devices": 3}', '{"devices": ["0"], "memory_share": 2}']
)
def test_a_malformed_lease_variable_is_named(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("HWPOOL_LEASE", text)
    with pytest.raises(ValueError, match=r"HWPOOL_LEASE must .* got"):
        hwpool.torch_limit()


def test_without_torch_it_says_so_and_sets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setenv("HWPOOL_LEASE", '{"gpus":[0],"devices":["0"],"memory_share":0.5}')
    with pytest.raises(ImportError, match=r"torch_limit\(\) needs PyTorch"):
        hwpool.torch_limit()
