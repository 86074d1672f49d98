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
SMI = (  # the CSV query (index, uuid, name, MiB, MiB used, reserved); nothing for -L
    f"[ \"$1\" = -L ] && exit 0\ncat <<'EOF'\n"
    f"0, {UUIDS[0]}, NVIDIA A100, 81559, 0, [N/A]\n"
    f"1, {UUIDS[1]}, NVIDIA A100, 40960, 0, [N/A]\nEOF\n"
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
        "gpus": [1], "fraction": 0.25, "devices": [UUIDS[1]], "memory_share": 0.25,
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
        "HWPOOL_LEASE": '{"gpus":[0],"fraction":0.5,"devices":["0"],"memory_share":0.5}',
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5",
        "XLA_CLIENT_MEM_FRACTION": "0.5",
    }  # fmt: skip
    assert child["KEPT"] == "given" and child["HWPOOL_SOCKET"] is None


JAX_VARS = (
    "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION",
)  # fmt: skip
SHOW_JAX = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {JAX_VARS!r}}}))"


def jax_knobs(env: dict[str, str]) -> dict[str, str]:
    """The JAX variables of ``env``."""
    return {name: env[name] for name in JAX_VARS if name in env}


def test_a_child_of_a_fraction_lease_gets_jaxs_memory_knobs() -> None:
    pool = GPUPool(1)
    lease = pool.lease(0.25)
    with lease:
        child = seen(lease.run([sys.executable, "-c", SHOW_JAX], capture_output=True, text=True))
    assert child == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25",
        "XLA_CLIENT_MEM_FRACTION": "0.25",
    }  # fmt: skip


def test_a_memory_lease_caps_jax_at_its_mib_over_the_detected_total(
    fake_smi: Callable[[str], Path],
) -> None:
    fake_smi(SMI.replace("81559, 0", "81559, 40599"))  # GPU 0: 81559 MiB, 40599 in use
    pool = GPUPool(memory=True, reserve_in_use=True)
    assert pool.gpu_memory == (40960, 40960)  # the pool shares half of GPU 0
    lease = pool.lease(memory="10GiB")
    with pool.lease(memory="30GiB") as gpus, lease:
        env = lease.env({})
    assert gpus == [0] and env["CUDA_VISIBLE_DEVICES"] == UUIDS[0]  # best fit: next to it
    share = 10240 / 81559  # of the device, not of the pool's part of it
    assert json.loads(env["HWPOOL_LEASE"])["memory_share"] == pytest.approx(share)
    assert jax_knobs(env) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1255",
        "XLA_CLIENT_MEM_FRACTION": "0.1255",
    }  # fmt: skip  (rounded down)


def test_whole_gpus_get_no_framework_knob() -> None:
    pool = GPUPool(2)
    for lease in (pool.lease(1.0), pool.lease_full(2)):
        with lease:
            env = lease.env({})
        assert jax_knobs(env) == {} and "memory_share" not in json.loads(env["HWPOOL_LEASE"])


def test_a_knob_set_in_the_base_environment_wins() -> None:
    pool = GPUPool(1)
    lease = pool.lease(0.5)
    with lease:
        mine = lease.env({"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "XLA_CLIENT_MEM_FRACTION": ".9"})
        old_name = lease.env({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".7"})
    assert jax_knobs(mine) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
        "XLA_CLIENT_MEM_FRACTION": ".9",
    }
    assert jax_knobs(old_name) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".7",
    }  # fmt: skip


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
