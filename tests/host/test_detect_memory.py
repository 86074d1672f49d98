"""Detection of memory, names, UUIDs and MIG instances: a fake NVML and a fake nvidia-smi."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fakes.gpus import A100, H100_MIG, RTX, smi_script
from hwpool import GPUInfo, GPUSource, detect_gpus

MIG_UUIDS = [m.uuid for m in H100_MIG.migs or [] if m is not None]


def test_two_sizes_through_nvidia_smi(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([A100, RTX]))
    found = detect_gpus()
    assert (found.source, found.count) == (GPUSource.NVIDIA_SMI, 2)
    assert [(g.device_id, g.uuid, g.memory_mib) for g in found.gpus] == [
        ("0", A100.uuid, 81920),
        ("1", RTX.uuid, 24564),
    ]
    assert found.gpus[1].name == "NVIDIA GeForce RTX 4090" and found.gpus[1].parent is None
    assert found.nvidia_smi == "nvidia-smi listed 2 GPUs"
    assert found.nvml == "NVML not used (pynvml not installed: pip install 'hwpool[nvml]')"


def test_two_sizes_through_nvml(fake_nvml, fake_smi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f"touch {tmp_path}/asked\n")
    nvml = fake_nvml([A100, RTX])
    found = detect_gpus()
    assert (found.source, found.count, found.nvml) == (GPUSource.NVML, 2, "NVML listed 2 GPUs")
    assert found.gpus == (
        GPUInfo(0, "0", A100.uuid, 81920, A100.name),
        GPUInfo(1, "1", RTX.uuid, 24564, RTX.name),
    )
    assert found.nvidia_smi is None and not (tmp_path / "asked").exists()
    assert nvml.calls == ["init", "shutdown"]
    detect_gpus()
    assert nvml.calls == ["init", "shutdown"]  # cached for the process


def test_mig_partitioned_h100_through_nvidia_smi(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([H100_MIG, RTX]))
    found = detect_gpus()
    assert found.count == 4
    *migs, rtx = found.gpus
    assert [g.device_id for g in migs] == MIG_UUIDS == [g.uuid for g in migs]
    assert [g.index for g in found.gpus] == [0, 1, 2, 3]
    # The default table's "MIG devices" section gives each device's memory as the driver
    # reports it (as NVML does), never the profile name's rounding (issue 36).
    assert [g.memory_mib for g in migs] == [40448, 20096, 9856]
    assert all(g.is_mig and g.parent == H100_MIG.uuid for g in migs)
    assert migs[0].name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert (rtx.device_id, rtx.memory_mib, rtx.is_mig) == ("1", 24564, False)
    assert found.nvidia_smi == "nvidia-smi listed 2 GPUs, 3 MIG instances on 1 of them"


def test_mig_partitioned_h100_through_nvml(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    fake_nvml([A100, H100_MIG])  # MIG-capable but off, then MIG on with an empty slot
    found = detect_gpus()
    assert found.source == GPUSource.NVML and found.count == 4
    a100, *migs = found.gpus
    assert (a100.device_id, a100.memory_mib, a100.is_mig) == ("0", 81920, False)
    assert [(g.device_id, g.memory_mib, g.parent) for g in migs] == [
        (uuid, size, H100_MIG.uuid)
        for uuid, size in zip(MIG_UUIDS, [40448, 20096, 9856], strict=True)
    ]
    assert found.nvml == "NVML listed 2 GPUs, 3 MIG instances on 1 of them"


def test_nvml_failing_at_init_falls_back_to_nvidia_smi(fake_nvml, fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([A100, RTX]))
    fake_nvml([A100, RTX], fail_init="Driver Not Loaded")
    found = detect_gpus()
    assert (found.source, found.count) == (GPUSource.NVIDIA_SMI, 2)
    assert found.nvml == "NVML failed at init (NVMLError: Driver Not Loaded)"
    assert found.detail == "nvidia-smi (NVML failed at init (NVMLError: Driver Not Loaded))"
    assert found.gpus[1].memory_mib == 24564


def test_nvml_failing_and_nvidia_smi_missing(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    fake_nvml([A100], fail_init="Driver Not Loaded")
    found = detect_gpus()
    assert (found.source, found.count) == (GPUSource.DEFAULT, 1)
    assert found.detail == (
        "no GPU found (NVML failed at init (NVMLError: Driver Not Loaded); "
        "nvidia-smi not found on PATH): 1 logical GPU"
    )


def test_nvidia_smi_missing_and_nvml_absent(fake_smi) -> None:  # type: ignore[no-untyped-def]
    found = detect_gpus(describe=True)
    assert (found.source, found.count, found.gpus) == (GPUSource.DEFAULT, 1, (GPUInfo(0, "0"),))
    assert found.nvidia_smi == "nvidia-smi not found on PATH"
    assert found.nvml is not None and found.nvml.startswith("NVML not used")


def test_nvidia_smi_list_failing_keeps_the_whole_gpus(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(
        '[ "$1" = -L ] && exit 4\necho "0, GPU-x, NVIDIA H100 80GB HBM3, 81559, [N/A], [N/A]"\n'
    )
    found = detect_gpus()
    assert found.gpus == (GPUInfo(0, "0", "GPU-x", 81559, "NVIDIA H100 80GB HBM3"),)
    assert found.nvidia_smi == (
        "nvidia-smi listed 1 GPU; nvidia-smi -L: nvidia-smi exited 4, so no MIG instance is known"
    )


@pytest.mark.parametrize("source", ["nvml", "nvidia-smi"])
def test_uuid_entries_in_cuda_visible_devices(  # type: ignore[no-untyped-def]
    fake_smi, fake_nvml, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    fake_smi(smi_script([H100_MIG, RTX, A100]))
    if source == "nvml":
        fake_nvml([H100_MIG, RTX, A100])
    # A GPU UUID prefix (CUDA accepts one), a whole UUID, and one that names no GPU: CUDA
    # reads no further than that one.
    entries = [RTX.uuid[:12], A100.uuid, "GPU-ffff", RTX.uuid]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(entries))
    for found in (detect_gpus(), detect_gpus(describe=True)):
        assert (found.source, found.count) == (GPUSource.CUDA_VISIBLE_DEVICES, 2)
        assert [g.device_id for g in found.gpus] == entries[:2]
        assert [g.index for g in found.gpus] == [0, 1]
        assert [g.uuid for g in found.gpus] == [RTX.uuid, A100.uuid]
        assert [g.memory_mib for g in found.gpus] == [24564, 81920]
        assert f", 2 of 2 matched through {source}; entry 'GPU-ffff' names no GPU" in found.detail
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_UUIDS[2])
    (mig,) = detect_gpus().gpus
    assert (mig.uuid, mig.parent, mig.device_id) == (MIG_UUIDS[2], H100_MIG.uuid, MIG_UUIDS[2])


def test_an_ambiguous_uuid_prefix_ends_the_list(fake_smi, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    twin = replace(A100, uuid=A100.uuid.replace("aaaa-", "aaab-", 1))
    fake_smi(smi_script([A100, twin]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a100aaa")
    found = detect_gpus(describe=True)
    assert found.gpus == () and "is ambiguous: the UUIDs of 2 GPUs start with it" in found.detail


def test_index_entry_does_not_name_a_mig_partitioned_gpu(
    fake_smi, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([H100_MIG, RTX]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # indexes are nvidia-smi's
    gpus = detect_gpus(describe=True).gpus
    assert gpus[0] == GPUInfo(0, "0") and gpus[1].uuid == RTX.uuid


def test_hwpool_num_gpus_still_decides_alone(fake_nvml, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    nvml = fake_nvml([A100])
    monkeypatch.setenv("HWPOOL_NUM_GPUS", "3")
    found = detect_gpus(describe=True)
    assert (found.count, found.source, found.nvml) == (3, GPUSource.ENV, None)
    assert nvml.calls == []


def test_nvml_failing_after_init_falls_back(fake_nvml, fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([RTX]))
    nvml = fake_nvml([A100])
    nvml.nvmlDeviceGetCount = lambda: 1 / 0  # a broken library, not only a missing driver
    found = detect_gpus()
    assert found.source == GPUSource.NVIDIA_SMI and found.gpus[0].uuid == RTX.uuid
    assert found.nvml == "NVML failed (ZeroDivisionError: division by zero)"
    assert nvml.calls == ["init", "shutdown"]
