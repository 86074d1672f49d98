"""GPU detection: environment variables and a fake nvidia-smi placed first on PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwpool import GPUSource, detect_gpus

SMI_OUTPUT = """\
0, GPU-1111aaaa-0000-0000-0000-000000000000, 81559
1, GPU-2222bbbb-0000-0000-0000-000000000000, 81559
"""


def test_env_override_wins(fake_smi, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f"cat <<'EOF'\n{SMI_OUTPUT}EOF\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("HWPOOL_NUM_GPUS", "6")
    found = detect_gpus()
    assert (found.count, found.source) == (6, GPUSource.ENV)
    assert [g.device_id for g in found.gpus] == ["0", "1", "2", "3", "4", "5"]


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", "", " "])
def test_env_override_must_be_positive_int(raw: str) -> None:
    with pytest.raises(ValueError, match=f"HWPOOL_NUM_GPUS must be an integer >= 1, got {raw!r}"):
        detect_gpus({"HWPOOL_NUM_GPUS": raw})


@pytest.mark.parametrize(
    ("raw", "ids"),
    [
        ("0,2", ["0", "2"]),
        (" 3 ", ["3"]),
        ("GPU-8f2c,GPU-11aa", ["GPU-8f2c", "GPU-11aa"]),
        ("MIG-5e3d0c5e-1f0a-5b67-8d8e-111111111111", ["MIG-5e3d0c5e-1f0a-5b67-8d8e-111111111111"]),
        ("", []),
        ("-1", []),
        ("0,-1,1", ["0"]),  # CUDA ignores everything from the first invalid entry on
    ],
)
def test_cuda_visible_devices(raw: str, ids: list[str]) -> None:
    found = detect_gpus({"CUDA_VISIBLE_DEVICES": raw})
    assert found.source == GPUSource.CUDA_VISIBLE_DEVICES
    assert found.count == len(ids) and [g.device_id for g in found.gpus] == ids
    assert [g.index for g in found.gpus] == list(range(len(ids)))


def test_nvidia_smi_parsed(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f"cat <<'EOF'\n{SMI_OUTPUT}EOF\n")
    found = detect_gpus()
    assert (found.count, found.source) == (2, GPUSource.NVIDIA_SMI)
    assert found.gpus[1].uuid == "GPU-2222bbbb-0000-0000-0000-000000000000"
    assert found.gpus[0].memory_mib == 81559 and found.gpus[1].device_id == "1"


def test_nvidia_smi_gets_the_documented_query(fake_smi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f'echo "$@" > {tmp_path}/args\necho "0, GPU-x, 1024"\n')
    assert detect_gpus().count == 1
    args = (tmp_path / "args").read_text().split()
    assert args == ["--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]


@pytest.mark.parametrize(
    "body",
    [
        "exit 9\n",  # non-zero exit
        "echo 'NVIDIA-SMI has failed because it could not communicate with the driver'\n",
        "echo '0, GPU-x'\n",  # a field missing
        "echo ''\n",  # no GPU listed
        "exec sleep 30\n",  # hangs: killed at the timeout
        "sleep 30 & wait\n",  # a child holding the pipe open: the whole group is killed
    ],
)
def test_nvidia_smi_failures_fall_through_to_default(fake_smi, body: str) -> None:  # type: ignore[no-untyped-def]
    fake_smi(body)
    found = detect_gpus(nvidia_smi_timeout=0.5)
    assert (found.count, found.source) == (1, GPUSource.DEFAULT)


def test_missing_nvidia_smi_gives_one_logical_gpu(fake_smi) -> None:  # type: ignore[no-untyped-def]
    found = detect_gpus()
    assert (found.count, found.source) == (1, GPUSource.DEFAULT)
    assert found.gpus[0].device_id == "0"


def test_non_executable_nvidia_smi_is_ignored(fake_smi) -> None:  # type: ignore[no-untyped-def]
    exe = fake_smi("echo '0, GPU-x, 1'\n")
    exe.chmod(0o644)
    assert detect_gpus().source == GPUSource.DEFAULT
