"""``hwpool info`` as a doctor: versions, memory as the driver means it, every problem with its
fix. Fed a recorded nvidia-smi (tests/fakes/captures/, expected values from the capture text)
or an NVML fake that follows NVIDIA's documented return codes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from fakes import recorded_smi
from fakes.gpus import FakeGPU
from fakes.recorded_smi import H100, RTX_2080_SUPER_WINDOWS
from hwpool._cli._info import format_info, gather
from hwpool._host._versions import parse_smi_version

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"


def info_text(info: dict[str, object]) -> list[str]:
    return format_info(json.loads(json.dumps(info))).splitlines()  # what --json users get


def test_versions_and_memory_from_a_recorded_h100(
    fake_smi: Callable[[str], Path], tmp_path: Path
) -> None:
    """linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt: ``NVML version : 590.48``,
    ``DRIVER version : 590.48.01``, ``CUDA Version : 13.1``; load: 81559 MiB total, 19818
    used, 479 reserved. Before: no versions, and the reserved memory unseen."""
    recorded_smi.install(tmp_path, H100, "load")
    info = gather()
    assert info["gpus"]["versions"] == {
        "driver": "590.48.01", "nvml": "590.48", "cuda": "13.1", "source": "nvidia-smi",
        "problem": "",
    }  # fmt: skip
    (device,) = info["gpus"]["devices"]
    assert (device["memory_reserved_mib"], device["memory_free_mib"]) == (479, 81559 - 19818 - 479)
    lines = info_text(info)
    assert lines[1] == "  driver 590.48.01, NVML 590.48, CUDA 13.1 (from nvidia-smi)"
    assert lines[2] == (
        f"  GPU 0: device 0 (NVIDIA H100 80GB HBM3, {GPU0}, 81559 MiB, 19818 MiB in use, "
        "479 MiB reserved, 61262 MiB free)"
    )
    assert "  GPU 0: 19818 MiB / 81559 MiB used (+479 MiB reserved), 100% busy" in lines
    assert info["problems"] == [] and "Problems: none found" in lines


def test_windows_versions_are_the_kmd_and_cuda_umd_lines() -> None:
    """windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt: ``DRIVER version :
    Deprecated, see "KMD version" instead``, ``KMD version : 610.62``, ``CUDA UMD version :
    13.3``."""
    text = recorded_smi.Capture(RTX_2080_SUPER_WINDOWS).section("capabilities :: version")
    versions = parse_smi_version(text)
    assert (versions.driver, versions.nvml, versions.cuda) == ("610.62", "610.62", "13.3")


def test_a_driver_library_mismatch_is_said_with_its_fix(fake_smi: Callable[[str], Path]) -> None:
    """nvidia-smi's words (exit 18, mozilla/translations#1167) and what to do. Before:
    "nvidia-smi exited 18" in the detail, and nothing more."""
    fake_smi(
        "echo 'Failed to initialize NVML: Driver/library version mismatch'\n"
        "echo 'NVML library version: 550.144'\nexit 18\n"
    )
    info = gather()
    said = (
        "nvidia-smi exited 18: Failed to initialize NVML: Driver/library version mismatch; "
        "NVML library version: 550.144"
    )
    problems = {entry["where"]: entry for entry in info["problems"]}
    assert problems["nvidia-smi"]["problem"] == said
    assert "reboot" in problems["nvidia-smi"]["fix"]
    lines = info_text(info)
    assert f"  nvidia-smi: {said}" in lines
    assert lines[lines.index(f"  nvidia-smi: {said}") + 1].startswith("    fix: the loaded kernel")


def test_a_lost_gpu_through_nvml_is_named_with_its_fix(
    fake_nvml: Callable[..., ModuleType],
) -> None:
    """NVML_ERROR_GPU_IS_LOST on GPU 1's handle: the other two are listed, GPU 1 is named
    under them and among the problems, with what to do."""
    fake_nvml([
        FakeGPU("GPU-a", "NVIDIA H100 80GB HBM3", 81559, used_mib=0, reserved_mib=479),
        FakeGPU("GPU-b", "NVIDIA H100 80GB HBM3", 81559,
                failing={"nvmlDeviceGetHandleByIndex": "GpuIsLost"}),
        FakeGPU("GPU-c", "NVIDIA H100 80GB HBM3", 81559, used_mib=0, reserved_mib=479),
    ])  # fmt: skip
    info = gather()
    assert info["gpus"]["versions"]["driver"] == "590.48.01"
    assert info["gpus"]["versions"]["cuda"] == "13.1"
    assert [d["uuid"] for d in info["gpus"]["devices"]] == ["GPU-a", "GPU-c"]
    assert info["gpus"]["failed"] == [
        {"device": "device 1", "error": "NVMLError_GpuIsLost: GPU is lost"}
    ]
    lost = [entry for entry in info["problems"] if entry["where"] == "device 1"]
    assert len(lost) == 1 and "fell off the bus" in lost[0]["fix"]
    lines = info_text(info)
    assert "  left out: device 1: NVMLError_GpuIsLost: GPU is lost" in lines
    assert "  device 1: NVMLError_GpuIsLost: GPU is lost" in lines
