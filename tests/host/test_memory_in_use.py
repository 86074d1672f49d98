"""Memory in use on each GPU: read at detection and again by gpu_memory_in_use, from a fake
NVML and a fake nvidia-smi (tests/fakes/gpus.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fakes.gpus import A100, H100_MIG, RTX, smi_script
from hwpool import GPUInfo, GPUSource, detect_gpus, gpu_memory_in_use

DESKTOP = replace(RTX, used_mib=1536)  # a desktop session holds 1.5 GiB of the card
BUSY = replace(A100, used_mib=20480)
MIGS = [
    replace(m, used_mib=used) if m is not None else None
    for m, used in zip(H100_MIG.migs or [], [4096, 0, 512, None], strict=True)
]
H100_BUSY = replace(H100_MIG, migs=MIGS, used_mib=4608)


def test_used_memory_through_nvidia_smi(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([BUSY, DESKTOP, A100]))  # A100: nvidia-smi prints [N/A]
    found = detect_gpus()
    assert found.source == GPUSource.NVIDIA_SMI
    assert [(g.memory_mib, g.memory_used_mib) for g in found.gpus] == [
        (81920, 20480),
        (24564, 1536),
        (81920, None),
    ]


def test_used_memory_through_nvml_is_rounded_up(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    nvml = fake_nvml([BUSY, DESKTOP, A100])  # the fake's bytes are 4 KiB short of whole MiB
    found = detect_gpus()
    assert found.source == GPUSource.NVML
    assert [g.memory_used_mib for g in found.gpus] == [20480, 1536, None]
    assert found.gpus[1] == GPUInfo(1, "1", RTX.uuid, 24564, RTX.name, memory_used_mib=1536)
    assert nvml.calls == ["init", "shutdown"]


def test_used_memory_of_mig_instances_through_nvml(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    fake_nvml([H100_BUSY, DESKTOP])
    found = detect_gpus()
    assert [(g.is_mig, g.memory_used_mib) for g in found.gpus] == [
        (True, 4096),
        (True, 512),
        (True, None),  # NVML gave no reading for this instance
        (False, 1536),
    ]


def test_nvidia_smi_reads_mig_device_use_from_its_table(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([H100_BUSY, DESKTOP]))
    found = detect_gpus()
    # memory.used is the physical GPU's; the default table's "MIG devices" section gives each
    # device's (its GPU instance's), N/A where the driver has none (issue 36).
    assert [g.memory_used_mib for g in found.gpus] == [4096, 512, None, 1536]


@pytest.mark.parametrize(
    ("used", "expected"), [("[N/A]", None), ("[Not Supported]", None), ("0", 0), ("7", 7)]
)
def test_nvidia_smi_used_field(fake_smi, used: str, expected: int | None) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f'echo "0, GPU-x, NVIDIA, Inc. T4, 15360, {used}, [N/A]"\n')
    (gpu,) = detect_gpus().gpus
    assert (gpu.name, gpu.memory_mib, gpu.memory_used_mib) == ("NVIDIA, Inc. T4", 15360, expected)


@pytest.mark.parametrize(
    "line",
    [
        "0, GPU-x, Tesla T4, 15360",  # the query without memory.used: a name is not a size
        "0, GPU-x, Tesla T4, 15360, 0",  # nor without memory.reserved
        "0, GPU-x, Tesla T4, 15360, lots, 0",
        "0, GPU-x, Tesla T4, 15360, -1, 0",
        "0, GPU-x, Tesla T4, N/A, 0, 0",
    ],
)
def test_nvidia_smi_output_other_than_the_query_is_refused(fake_smi, line: str) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f'echo "{line}"\n')
    found = detect_gpus()
    assert found.source == GPUSource.DEFAULT
    assert found.nvidia_smi == f"nvidia-smi printed something other than the queried CSV: {line}"


def test_in_use_is_read_anew_through_nvml(fake_nvml, fake_smi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f"touch {tmp_path}/asked\n")
    nvml = fake_nvml([BUSY, H100_BUSY])
    gpus = detect_gpus().gpus
    assert gpu_memory_in_use(gpus) == (20480, 4096, 512, None)
    nvml.MACHINE[0]["used_mib"] = 30000  # someone else allocated since
    nvml.MACHINE[1]["migs"][0]["used_mib"] = 0
    assert gpu_memory_in_use(gpus) == (30000, 0, 512, None)
    assert detect_gpus().gpus[0].memory_used_mib == 20480  # detection stays cached
    assert nvml.calls == ["init", "shutdown"] * 3
    assert not (tmp_path / "asked").exists()


def test_in_use_is_read_anew_through_nvidia_smi(fake_smi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([BUSY, DESKTOP], log=str(tmp_path / "args")))
    gpus = detect_gpus().gpus
    assert gpu_memory_in_use(gpus) == (20480, 1536)
    assert gpu_memory_in_use(gpus) == (20480, 1536)
    args = (tmp_path / "args").read_text().splitlines()
    assert args[2:] == ["--query-gpu=uuid,memory.used --format=csv,noheader,nounits"] * 2
    fake_smi(smi_script([replace(BUSY, used_mib=0), replace(DESKTOP, used_mib=None)]))
    assert gpu_memory_in_use(gpus) == (0, None)


def test_in_use_matches_gpus_by_uuid(fake_smi, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([BUSY, DESKTOP]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{DESKTOP.uuid},{BUSY.uuid}")
    gpus = detect_gpus(describe=True).gpus
    assert [g.memory_used_mib for g in gpus] == [1536, 20480]
    assert gpu_memory_in_use(gpus) == (1536, 20480)
    assert gpu_memory_in_use(()) == ()
    assert gpu_memory_in_use([GPUInfo(0, "0"), GPUInfo(1, "1", "GPU-elsewhere")]) == (None, None)


def test_in_use_falls_back_to_nvidia_smi_when_nvml_fails_at_init(fake_nvml, fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([DESKTOP]))
    nvml = fake_nvml([replace(DESKTOP, used_mib=99)], fail_init="Driver Not Loaded")
    gpus = detect_gpus().gpus
    assert gpu_memory_in_use(gpus) == (1536,)
    assert nvml.calls == ["init", "init"]


def test_in_use_falls_back_to_nvidia_smi_when_nvml_breaks(fake_nvml, fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([DESKTOP]))
    nvml = fake_nvml([replace(DESKTOP, used_mib=99)])
    gpus = detect_gpus().gpus
    assert gpus[0].memory_used_mib == 99
    nvml.nvmlDeviceGetCount = lambda: 1 / 0
    assert gpu_memory_in_use(gpus) == (1536,)
    assert nvml.calls[-1] == "shutdown"  # what was initialised is shut down


def test_in_use_without_nvml_asks_nvidia_smi(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([DESKTOP]))
    assert gpu_memory_in_use([GPUInfo(0, "0", DESKTOP.uuid)]) == (1536,)


@pytest.mark.parametrize(
    "body", ["", "exit 9\n", "echo 'Failed to initialize NVML: Driver/library version mismatch'\n"]
)
def test_in_use_never_raises_for_want_of_a_source(fake_smi, body: str) -> None:  # type: ignore[no-untyped-def]
    if body:  # else no nvidia-smi on PATH at all
        fake_smi(body)
    gpus = [GPUInfo(0, "0", DESKTOP.uuid, 24564), GPUInfo(1, "1")]
    assert gpu_memory_in_use(gpus) == (None, None)


def test_in_use_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match=r"gpus\[1\] must be a GPUInfo \(from detect_gpus\), got 0"):
        gpu_memory_in_use([GPUInfo(0, "0"), 0])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="nvidia_smi_timeout must be a number > 0, got 0"):
        gpu_memory_in_use([], nvidia_smi_timeout=0)
    with pytest.raises(TypeError, match="nvidia_smi_timeout"):
        gpu_memory_in_use([], nvidia_smi_timeout="5")  # type: ignore[arg-type]
