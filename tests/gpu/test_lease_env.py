"""A lease names its devices and starts children on them: the child's CUDA_VISIBLE_DEVICES.

Real child processes print what they see; a fake ``nvidia-smi`` first on PATH reports UUIDs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hwpool
from hostserver import ENV, Server
from hwpool import GPUPool
from hwpool._wire._connection import Wire
from hwpool._wire._protocol import Status, StatusReply, encode

UUIDS = ("GPU-1111aaaa-0000-0000-0000-000000000000", "MIG-2222bbbb-0000-0000-0000-000000000000")
SMI = (  # the CSV query (index, uuid, name, MiB, MiB used); nothing for -L (no MIG instance)
    f"[ \"$1\" = -L ] && exit 0\ncat <<'EOF'\n"
    f"0, {UUIDS[0]}, NVIDIA A100, 81559, 0\n1, {UUIDS[1]}, NVIDIA A100, 40960, 0\nEOF\n"
)
SHOW = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'HWPOOL_LEASE', 'HWPOOL_SOCKET', 'KEPT')}))"
)


def seen(proc: subprocess.CompletedProcess[str]) -> dict[str, str | None]:
    assert proc.returncode == 0, proc.stderr
    found: dict[str, str | None] = json.loads(proc.stdout)
    return found


def test_a_child_of_a_detected_pool_sees_the_uuid(fake_smi: Callable[[str], Path]) -> None:
    fake_smi(SMI)
    pool = GPUPool()
    with pool.lease(1.0), pool.lease(0.5) as gpus:
        lease = pool.lease(0.25)
        with lease:
            assert lease.gpus == gpus == [1]
            assert lease.devices == [UUIDS[1]]
            child = seen(lease.run([sys.executable, "-c", SHOW], capture_output=True, text=True))
    assert child["CUDA_VISIBLE_DEVICES"] == UUIDS[1]
    assert child["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert json.loads(child["HWPOOL_LEASE"] or "") == {
        "gpus": [1], "fraction": 0.25, "devices": [UUIDS[1]],
    }  # fmt: skip


def test_an_inherited_visible_list_maps_logical_gpu_1_to_its_entry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HWPOOL_NUM_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    pool = GPUPool()
    held = pool.lease(0.5)
    with pool.lease(1.0) as first, held:
        assert first == [0] and held.gpus == [1] and held.devices == ["3"]
        with held.popen([sys.executable, "-c", SHOW], stdout=subprocess.PIPE, text=True) as p:
            out, _ = p.communicate(timeout=30)
    assert json.loads(out)["CUDA_VISIBLE_DEVICES"] == "3"


def test_whole_gpus_are_listed_in_lease_order() -> None:
    pool = GPUPool(3)
    lease = pool.lease_full(2)
    with pool.lease(0.5), lease:
        env = lease.env({})
    assert lease.gpus == [] and env["CUDA_VISIBLE_DEVICES"] == "1,2"
    assert json.loads(env["HWPOOL_LEASE"]) == {
        "gpus": [1, 2],
        "fraction": 1.0,
        "devices": ["1", "2"],
    }


def test_env_keeps_the_base_and_drops_the_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPOOL_SOCKET", "/nonexistent/s.sock")
    monkeypatch.setenv("KEPT", "from os.environ")
    pool = GPUPool(2)
    with pool.lease(0.5):
        lease = pool.lease(0.5)
        with lease:
            env = lease.env()
            base = lease.env({"KEPT": "from base", "CUDA_VISIBLE_DEVICES": "7"})
            child = seen(
                lease.run(
                    [sys.executable, "-c", SHOW], env={**os.environ, "KEPT": "given"},
                    capture_output=True, text=True,
                )
            )  # fmt: skip
    assert env["KEPT"] == "from os.environ" and "HWPOOL_SOCKET" not in env
    assert base == {
        "KEPT": "from base", "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HWPOOL_LEASE": '{"gpus":[0],"fraction":0.5,"devices":["0"]}',
    }  # fmt: skip
    assert child["KEPT"] == "given" and child["HWPOOL_SOCKET"] is None


def test_a_lease_that_holds_nothing_starts_no_child() -> None:
    pool = GPUPool(1)
    lease = pool.lease(0.5)
    assert lease.devices == []
    for call in (lease.env, lambda: lease.run(["true"]), lambda: lease.popen(["true"])):
        with pytest.raises(RuntimeError, match="holds no GPU"):
            call()
    with lease:
        pass
    with pytest.raises(RuntimeError, match="holds no GPU"):
        lease.env()


@pytest.fixture
def smi_server(fake_smi: Callable[[str], Path]) -> Iterator[Server]:
    """A real server that detected the fake nvidia-smi's two GPUs (UUIDs)."""
    fake_smi(SMI)
    directory = Path(tempfile.mkdtemp(prefix="hwe", dir="/tmp"))
    env = {k: v for k, v in ENV.items() if k not in ("CUDA_VISIBLE_DEVICES", "HWPOOL_NUM_GPUS")}
    server = Server(directory / "s.sock", env={**env, "PATH": os.environ["PATH"]})
    try:
        yield server.ready()
    finally:
        server.kill()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_server_lease_names_the_servers_devices(smi_server: Server) -> None:
    with hwpool.connect(smi_server.socket, reconnect_timeout=0) as pool:
        assert [g.uuid for g in pool.gpus] == list(UUIDS)
        with pool.lease(1.0):
            lease = pool.lease(0.5)
            with lease:
                assert lease.devices == [UUIDS[1]]
                child = seen(
                    lease.run([sys.executable, "-c", SHOW], capture_output=True, text=True)
                )
                lease_id = json.loads(child["HWPOOL_LEASE"] or "")["id"]
                ids = [x.id for x in _status(smi_server.socket).leases]
    about = json.loads(child["HWPOOL_LEASE"] or "")
    assert child["CUDA_VISIBLE_DEVICES"] == UUIDS[1]
    assert about["socket"] == str(smi_server.socket) and about["gpus"] == [1]
    assert lease_id in ids


def _status(socket: Path) -> StatusReply:
    wire = Wire(socket)
    try:
        wire.send_bytes(encode(Status(1)))
        reply = wire.read()
    finally:
        wire.shutdown()
    assert isinstance(reply, StatusReply)
    return reply
