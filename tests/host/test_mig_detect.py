"""MIG devices detected as the driver builds them (issue 36): sizes as the driver reports
them, compute instances of one GPU instance in one ``memory_group``, NVML as a non-root user.

The nvidia-smi tests answer from real recordings (``tests/fakes/captures/``, copied unchanged
from ``../shared/realgpu/captures/``):

- ``linux-x86_64__nvidia-h200-mig__590.48.01.txt``: an H200 with five MIG devices; devices 0
  and 1 are compute instances 0 and 1 of GPU instance 2 (71424 MiB, shared), devices 3 and 4
  are ``1g.18gb`` GPU instances 9 and 10 of 16384 MiB each (the profile name's 18 GB would
  be 17166 MiB);
- ``linux-x86_64__nvidia-h100-mig__590.48.01.txt``: an H100 with four MIG devices, one compute
  instance per GPU instance.

The NVML tests use the fake ``pynvml`` of ``tests/fakes/gpus.py``, which returns
NVML_ERROR_NO_PERMISSION where NVIDIA documents it for a user without privileges (the
parent GPU's memory info in MIG mode).
"""

from __future__ import annotations

from dataclasses import replace

from fakes.gpus import H100_MIG, RTX, FakeMIG, smi_script
from fakes.mig_captures import H100_MIG as H100_CAPTURE
from fakes.mig_captures import H200_MIG, capture_smi
from hwpool._host._detect import GPUSource, detect_gpus

H200 = "GPU-00000000-0000-0000-0000-000000000000"


def mig(n: int) -> str:
    return f"MIG-0000000{n}-0000-0000-0000-00000000000{n}"


def test_h200_mig_capture_sizes_and_groups_through_nvidia_smi(fake_smi) -> None:  # type: ignore[no-untyped-def]
    """The defect: two compute instances of GPU instance 2 were two GPUs of 67711 MiB each
    (from "71gb"), 135 GiB where the driver has 71424 MiB; now each reports the driver's
    71424 MiB and both name one memory."""
    fake_smi(capture_smi(H200_MIG, "load"))
    found = detect_gpus()
    assert found.source == GPUSource.NVIDIA_SMI
    assert [(g.uuid, g.memory_mib, g.memory_used_mib, g.memory_group) for g in found.gpus] == [
        (mig(0), 71424, 16925, f"{H200}/gi2"),
        (mig(1), 71424, 16925, f"{H200}/gi2"),
        (mig(2), 33280, 17, f"{H200}/gi3"),
        (mig(3), 16384, 9, f"{H200}/gi9"),
        (mig(4), 16384, 9, f"{H200}/gi10"),
    ]
    assert all(g.is_mig and g.parent == H200 and g.device_id == g.uuid for g in found.gpus)
    assert found.gpus[3].name == "NVIDIA H200 MIG 1g.18gb"


def test_1g_18gb_is_what_the_device_reports_not_what_its_name_says(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(capture_smi(H200_MIG, "idle"))
    sizes = {g.name: g.memory_mib for g in detect_gpus().gpus}
    assert sizes["NVIDIA H200 MIG 1g.18gb"] == 16384 != 18 * 10**9 // 2**20


def test_h100_mig_capture_one_compute_instance_per_gpu_instance(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(capture_smi(H100_CAPTURE, "load"))
    found = detect_gpus()
    assert [(g.memory_mib, g.memory_group) for g in found.gpus] == [
        (40448, f"{H200}/gi2"),
        (20096, f"{H200}/gi3"),
        (9984, f"{H200}/gi9"),
        (9984, f"{H200}/gi10"),
    ]
    assert len({g.memory_group for g in found.gpus}) == 4


def test_without_the_table_a_mig_device_size_is_unknown_not_guessed(fake_smi) -> None:  # type: ignore[no-untyped-def]
    body = capture_smi(H200_MIG, "load")
    fake_smi(f"[ $# -eq 0 ] && exit 9\n{body}")  # the default table fails
    found = detect_gpus()
    assert [g.memory_mib for g in found.gpus] == [None] * 5
    assert [g.memory_group for g in found.gpus] == [None] * 5
    assert "nvidia-smi exited 9, so their memory is unknown" in (found.nvidia_smi or "")


SHARED = replace(
    H100_MIG,
    migs=[
        FakeMIG("MIG-aaaaaaaa-0000-0000-0000-000000000000", "1c.3g.40gb", 40448, gi=2, ci=0),
        FakeMIG("MIG-bbbbbbbb-0000-0000-0000-000000000000", "2c.3g.40gb", 40448, gi=2, ci=1),
        FakeMIG("MIG-cccccccc-0000-0000-0000-000000000000", "1g.10gb", 9856, gi=9),
    ],
)


def test_nvml_names_the_gpu_instance_of_each_compute_instance(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    fake_nvml([SHARED, RTX])
    found = detect_gpus()
    assert found.source == GPUSource.NVML
    assert [(g.memory_mib, g.memory_group) for g in found.gpus] == [
        (40448, f"{SHARED.uuid}/gi2"),
        (40448, f"{SHARED.uuid}/gi2"),
        (9856, f"{SHARED.uuid}/gi9"),
        (24564, None),
    ]


def test_nvml_as_non_root_still_enumerates_mig_devices(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    """The defect: the parent's memory info answers NO_PERMISSION to a user (as NVML
    documents in MIG mode), which dropped NVML altogether; the MIG handles answer."""
    fake_nvml([SHARED, RTX], non_root=True)
    found = detect_gpus()
    assert found.source == GPUSource.NVML, found.nvml
    assert [(g.uuid, g.memory_mib) for g in found.gpus] == [
        (SHARED.migs[0].uuid, 40448),  # type: ignore[index, union-attr]
        (SHARED.migs[1].uuid, 40448),  # type: ignore[index, union-attr]
        (SHARED.migs[2].uuid, 9856),  # type: ignore[index, union-attr]
        (RTX.uuid, 24564),
    ]
    assert found.nvml == "NVML listed 2 GPUs, 3 MIG instances on 1 of them"


def test_nvml_and_nvidia_smi_agree_on_a_shared_gpu_instance(fake_nvml, fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([SHARED, RTX]))
    by_smi = detect_gpus()
    nvml = fake_nvml([SHARED, RTX])
    by_nvml = detect_gpus()
    assert by_smi.source == GPUSource.NVIDIA_SMI and by_nvml.source == GPUSource.NVML
    assert nvml is not None
    fields = [(g.uuid, g.memory_mib, g.memory_group) for g in by_smi.gpus]
    assert fields == [(g.uuid, g.memory_mib, g.memory_group) for g in by_nvml.gpus]
