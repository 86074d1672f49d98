"""GPU detection: environment variables and a fake nvidia-smi placed first on PATH."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hwpool import GPUSource, detect_gpus

SMI_OUTPUT = """\
0, GPU-1111aaaa-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, 0, 479
1, GPU-2222bbbb-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, 0, 479
"""


def test_env_override_wins(fake_smi, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f"cat <<'EOF'\n{SMI_OUTPUT}EOF\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("HWPOOL_NUM_GPUS", "6")
    found = detect_gpus()
    assert (found.count, found.source) == (6, GPUSource.ENV)
    assert [g.device_id for g in found.gpus] == ["0", "1", "2", "3", "4", "5"]


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", "", " ", "²", "٣", " 4 "])
def test_env_override_must_be_positive_int(raw: str) -> None:
    # "²" passes str.isdigit() but not int(): it used to fail with int()'s bare message.
    message = re.escape(f"HWPOOL_NUM_GPUS must be an integer >= 1, got {raw!r}")
    with pytest.raises(ValueError, match=message):
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
        ("foo", []),  # not an index, a UUID or a MIG id: no GPU (it used to count as one)
        ("1,foo,2", ["1"]),
        ("0,,1", ["0"]),
        ("²", []),
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
    assert found.gpus[0].name == "NVIDIA H100 80GB HBM3" and not found.gpus[0].is_mig


def test_nvidia_smi_gets_the_documented_queries(fake_smi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f'echo "$@" >> {tmp_path}/args\necho "0, GPU-x, Tesla T4, 1024, 0, 0"\n')
    assert detect_gpus().count == 1
    args = (tmp_path / "args").read_text().splitlines()
    query = (
        "--query-gpu=index,uuid,name,memory.total,memory.used,memory.reserved "
        "--format=csv,noheader,nounits"
    )
    assert args == [query, "-L"]


@pytest.mark.parametrize(
    ("body", "outcome"),
    [
        ("exit 9\n", "nvidia-smi exited 9"),
        ("kill -9 $$\n", "nvidia-smi was killed by signal 9"),
        (
            "echo 'NVIDIA-SMI has failed because it could not communicate with the driver'\n",
            "nvidia-smi printed something other than the queried CSV: NVIDIA-SMI has failed "
            "because it could not communicate with the driver",
        ),
        ("echo '0, GPU-x'\n", "nvidia-smi printed something other than the queried CSV: 0, GPU-x"),
        (
            "echo '0, GPU-x, 1024'\n",
            "nvidia-smi printed something other than the queried CSV: 0, GPU-x, 1024",
        ),
        ("echo ''\n", "nvidia-smi listed no GPU"),
        ("exec sleep 30\n", "nvidia-smi timed out after 0.5 s"),  # killed at the timeout
        # A child holding the pipe open: the whole group is killed.
        ("sleep 30 & wait\n", "nvidia-smi timed out after 0.5 s"),
    ],
)
def test_nvidia_smi_failures_fall_through_and_say_what_happened(  # type: ignore[no-untyped-def]
    fake_smi, body: str, outcome: str
) -> None:
    # Before: every failure read "no GPU found", whatever had happened.
    fake_smi(body)
    found = detect_gpus(nvidia_smi_timeout=0.5)
    assert (found.count, found.source, found.nvidia_smi) == (1, GPUSource.DEFAULT, outcome)
    assert found.detail == f"no GPU found ({outcome}): 1 logical GPU"


def test_missing_nvidia_smi_gives_one_logical_gpu(fake_smi) -> None:  # type: ignore[no-untyped-def]
    found = detect_gpus()
    assert (found.count, found.source) == (1, GPUSource.DEFAULT)
    assert found.gpus[0].device_id == "0"
    assert found.nvidia_smi == "nvidia-smi not found on PATH"


def test_env_decides_without_asking_nvidia_smi(fake_smi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f"touch {tmp_path}/asked\n")
    assert detect_gpus({"HWPOOL_NUM_GPUS": "2"}).nvidia_smi is None
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "-1"}).nvidia_smi is None  # nothing to check
    assert not (tmp_path / "asked").exists()
    # An entry is checked against the hardware (CUDA ignores an index the machine lacks).
    assert detect_gpus({"CUDA_VISIBLE_DEVICES": "0"}).nvidia_smi == "nvidia-smi listed no GPU"
    assert (tmp_path / "asked").exists()


def test_hung_nvidia_smi_costs_its_timeout_once_per_process(fake_smi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Before: every GPUPool() ran nvidia-smi again and waited out the whole timeout.
    fake_smi(f"echo run >> {tmp_path}/runs\nexec sleep 30\n")
    first = detect_gpus(nvidia_smi_timeout=0.5)
    assert first.nvidia_smi == "nvidia-smi timed out after 0.5 s"
    for _ in range(3):
        assert detect_gpus(nvidia_smi_timeout=0.5) == first
    assert (tmp_path / "runs").read_text().splitlines() == ["run"]


def test_a_new_nvidia_smi_is_asked_afresh(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi("exit 3\n")
    assert detect_gpus().nvidia_smi == "nvidia-smi exited 3"
    fake_smi(f"cat <<'EOF'\n{SMI_OUTPUT}EOF\n# a different binary now\n")
    assert detect_gpus().nvidia_smi == "nvidia-smi listed 2 GPUs"


def test_non_executable_nvidia_smi_is_ignored(fake_smi) -> None:  # type: ignore[no-untyped-def]
    exe = fake_smi("echo '0, GPU-x, T4, 1, 0'\n")
    exe.chmod(0o644)
    assert detect_gpus().source == GPUSource.DEFAULT
