"""``hwpool serve`` where CUDA_VISIBLE_DEVICES hides every GPU, and its children's UUIDs.

Real ``hwpool serve`` processes. An empty ``CUDA_VISIBLE_DEVICES`` means no GPU (CUDA
Programming Guide, "CUDA Environment Variables"), as do ``-1`` and Slurm's ``NoDevFiles``:
before, the server served one GPU "0" there, and its jobs ran on the machine's first GPU. The
server's GPU is the recorded H100 (tests/fakes/captures/
linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt, copied unchanged from
../shared/realgpu/captures/), whose UUID the recording masks to ``GPU-00000000-...``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hwpool
from fakes.mig_captures import CAPTURES, capture_smi
from hostserver import BOUND, ENV, Server

H100 = CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory in /tmp (a socket path holds at most 107 bytes; tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="hwv", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def serve(sockdir: Path, visible: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in ENV.items() if k != "HWPOOL_NUM_GPUS"}
    env["CUDA_VISIBLE_DEVICES"] = visible
    return subprocess.run(
        [sys.executable, "-m", "hwpool", "serve", "--socket", str(sockdir / "s.sock"), *args],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip


@pytest.mark.parametrize("visible", ["", "-1", "NoDevFiles"])
def test_serve_refuses_to_start_without_a_visible_gpu(sockdir: Path, visible: str) -> None:
    proc = serve(sockdir, visible)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"hwpool: error: serve: CUDA_VISIBLE_DEVICES={visible!r}: ")
    assert "unset CUDA_VISIBLE_DEVICES or list the GPUs to share in it" in line
    assert "--gpus N to serve N logical GPUs" in line
    assert not (sockdir / "s.sock").exists()


def test_serve_gpus_0_is_refused_as_bad_usage(sockdir: Path) -> None:
    # The scheduler needs at least one GPU: --gpus 0 stays bad usage (see docs/gpus.md).
    proc = serve(sockdir, "", "--gpus", "0")
    assert proc.returncode == 2
    assert "argument --gpus: must be an integer >= 1, got 0" in proc.stderr


def test_serve_gpus_n_serves_logical_gpus_still(sockdir: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "HWPOOL_NUM_GPUS"}
    server = Server(sockdir / "s.sock", "--gpus", "2", env={**env, "CUDA_VISIBLE_DEVICES": ""})
    try:
        server.ready()
        with hwpool.connect(sockdir / "s.sock") as pool:
            assert pool.num_gpus == 2
    finally:
        server.kill()


def test_the_servers_children_are_given_uuids(
    sockdir: Path, fake_smi: Callable[[str], Path]
) -> None:
    # Before: a server started with CUDA_VISIBLE_DEVICES=0 gave its children "0".
    fake_smi(capture_smi(H100, "idle"))
    env = {k: v for k, v in ENV.items() if k != "HWPOOL_NUM_GPUS"}
    env.update(CUDA_VISIBLE_DEVICES="0", PATH=os.environ["PATH"])
    server = Server(sockdir / "s.sock", env=env)
    try:
        server.ready()
        with hwpool.connect(sockdir / "s.sock") as pool:
            lease = pool.lease(1.0)
            with lease:
                child = lease.run(
                    [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
                    capture_output=True, text=True, timeout=BOUND,
                )  # fmt: skip
        assert child.stdout.strip() == GPU0, child.stderr
        assert pool.gpus[0].uuid == GPU0 and pool.gpus[0].memory_mib == 81559
    finally:
        server.kill()
