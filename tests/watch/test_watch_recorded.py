"""The watcher fed what real drivers print, and one failing GPU among several.

nvidia-smi: the recorded fake (tests/fakes/recorded_smi.py) answers from the captures in
tests/fakes/captures/; the expected readings are written from each capture's ``--query-gpu``
and ``--query-compute-apps`` CSVs, quoted beside each case. NVML: the live fake raising
nvidia-ml-py's own error classes (NVML API reference return codes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fakes import recorded_smi
from fakes.live_nvml import FakeNVML, LiveGPU
from fakes.recorded_smi import (
    H100,
    H100_MIG,
    H200,
    H200_MIG,
    L40S,
    RTX_2080_SUPER_WINDOWS,
    RTX_4080_SUPER,
)
from hwpool._watch import GPUProcess, GPUReading, NvmlSampler, SmiSampler

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"


@pytest.fixture
def recorded(fake_smi: Callable[[str], Path], tmp_path: Path) -> Callable[[str, str], Path]:
    return lambda capture, phase: recorded_smi.install(tmp_path, capture, phase)


def procs(*pairs: tuple[int, int | None]) -> tuple[GPUProcess, ...]:
    return tuple(GPUProcess(pid, GPU0, mib) for pid, mib in sorted(pairs))


# (capture, phase, the reading written from its CSVs)
READINGS = [
    # H100 load: "81559 MiB, 479 MiB, 19818 MiB", "100 %"; memhog 11327 2566 MiB, 11328 1542
    # MiB, gpu_burn 11345 15690 MiB
    (H100, "load", GPUReading(
        GPU0, 81559, 19818, 100, procs((11327, 2566), (11328, 1542), (11345, 15690)), 479)),
    # H100 idle: no process
    (H100, "idle", GPUReading(GPU0, 81559, 0, 0, (), 479)),
    # H200 load: "143771 MiB, 614 MiB, 32362 MiB", "100 %"
    (H200, "load", GPUReading(
        GPU0, 143771, 32362, 100, procs((10291, 2566), (10293, 1542), (10309, 28234)), 614)),
    # L40S load: "46068 MiB, 609 MiB, 1235 MiB", "9 %"; two ffmpeg, 538 and 681 MiB
    (L40S, "load", GPUReading(GPU0, 46068, 1235, 9, procs((20037, 538), (20038, 681)), 609)),
    # RTX 4080 SUPER load: "16376 MiB, 434 MiB, 1474 MiB", "7 %"; kwin_wayland and ffmpeg
    (RTX_4080_SUPER, "load", GPUReading(
        GPU0, 16376, 1474, 7, procs((2165, 25), (5022, 503), (5021, 360)), 434)),
]  # fmt: skip


@pytest.mark.parametrize(("capture", "phase", "reading"), READINGS)
def test_smi_sample_as_recorded(
    recorded: Callable[[str, str], Path], capture: str, phase: str, reading: GPUReading
) -> None:
    """Before: the reserved memory was not read (``reserved_mib`` None)."""
    recorded(capture, phase)
    sample = SmiSampler().sample()
    assert (sample.source, sample.problem) == ("nvidia-smi", "")
    assert sample.gpus == (reading,)


def test_windows_wddm_process_memory_is_unknown_not_zero(
    recorded: Callable[[str, str], Path],
) -> None:
    """Under WDDM nvidia-smi prints ``[N/A]`` for every process's memory ("Not available on
    Windows when running in WDDM mode", its help says): unknown, never 0.

    windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt, load: 21 processes, "8192
    MiB, 205 MiB, 1366 MiB", "7 %".
    """
    recorded(RTX_2080_SUPER_WINDOWS, "load")
    (gpu,) = SmiSampler().sample().gpus
    assert (gpu.total_mib, gpu.used_mib, gpu.reserved_mib, gpu.utilization) == (8192, 1366, 205, 7)
    assert gpu.processes is not None and len(gpu.processes) == 21
    assert {p.used_mib for p in gpu.processes} == {None}
    assert {2140, 13092, 12940, 13820} <= {p.pid for p in gpu.processes}


@pytest.mark.parametrize(
    ("capture", "pids"),
    [
        # H100 MIG load: memhog 21180, 21181, gpu_burn 21198
        (H100_MIG, {21180, 21181, 21198}),
        # H200 MIG load: memhog 12249, 12250, gpu_burn 12267
        (H200_MIG, {12249, 12250, 12267}),
    ],
)
def test_smi_sample_in_mig_mode_sees_every_recorded_process(
    recorded: Callable[[str, str], Path], capture: str, pids: set[int]
) -> None:
    """Every recorded process is seen (which device each is given to is the MIG
    attribution's, not asserted here)."""
    recorded(capture, "load")
    sample = SmiSampler().sample()
    assert sample.gpus and {p.pid for p in sample.processes} == pids


LOST = "Unable to determine the device handle for GPU 0000:82:00.0: GPU is lost.  Reboot the system to recover this GPU"  # noqa: E501


def test_smi_lost_gpu_leaves_the_others_read(fake_smi: Callable[[str], Path]) -> None:
    """Before: the whole sample was unknown ("nvidia-smi exited 15")."""
    fake_smi(
        "case \"$1\" in --query-gpu=*) cat <<'EOF'\n"
        f"GPU-a, 81559, 1024, 5, 479\n{LOST}\nGPU-c, 81559, 0, 0, 479\nEOF\nexit 15 ;;\n"
        f"*) echo 'GPU-a, 77, 1000'; echo '{LOST}'; exit 15 ;; esac\n"
    )
    sample = SmiSampler().sample()
    assert [g.uuid for g in sample.gpus] == ["GPU-a", "GPU-c"]
    assert sample.gpus[0].processes == (GPUProcess(77, "GPU-a", 1000),)
    assert sample.problem == "GPU 0000:82:00.0: GPU is lost. Reboot the system to recover this GPU"


def test_smi_failure_carries_nvidia_smis_words(fake_smi: Callable[[str], Path]) -> None:
    fake_smi("echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    sample = SmiSampler().sample()
    assert sample.gpus == ()
    assert sample.problem == (
        "nvidia-smi exited 18: Failed to initialize NVML: Driver/library version mismatch"
    )


@pytest.mark.parametrize(
    ("error", "why"),
    [
        ("GpuIsLost", "NVMLError_GpuIsLost: GPU is lost"),
        ("Unknown", "NVMLError_Unknown: Unknown Error"),
    ],
)
def test_nvml_lost_gpu_leaves_the_others_read(error: str, why: str) -> None:
    """NVML_ERROR_GPU_IS_LOST / UNKNOWN on one handle. Before: "NVML failed (...)" and no
    reading of any GPU."""
    nvml = FakeNVML([
        LiveGPU("GPU-a", used_mib=100, processes={7: 100}),
        LiveGPU("GPU-b", failing={"nvmlDeviceGetHandleByIndex": error}),
        LiveGPU("GPU-c", used_mib=0),
    ])  # fmt: skip
    sample = NvmlSampler(nvml).sample()
    assert [g.uuid for g in sample.gpus] == ["GPU-a", "GPU-c"]
    assert sample.gpus[0].processes == (GPUProcess(7, "GPU-a", 100),)
    assert sample.problem == f"device 1: {why}"


def test_nvml_processes_on_a_driver_before_510() -> None:
    """Drivers before 510 lack ``nvmlDeviceGetComputeRunningProcesses_v3``, which
    nvidia-ml-py's unversioned name calls (NVMLLibraryMismatchError); the ``_v2`` entry point
    answers. Before: no process list at all (None)."""
    nvml = FakeNVML([LiveGPU("GPU-a", used_mib=3000, processes={5: 3000}, graphics={6: 10})])
    nvml.driver_lacks = {
        "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    }  # fmt: skip
    sampler = NvmlSampler(nvml)
    (gpu,) = sampler.sample().gpus
    assert gpu.processes == (GPUProcess(5, "GPU-a", 3000), GPUProcess(6, "GPU-a", 10))
    nvml.asked.clear()
    sampler.sample()  # the entry point that answered is kept: _v3 is not asked again
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in nvml.asked


def test_nvml_reserved_memory_is_read_apart() -> None:
    nvml = FakeNVML([LiveGPU("GPU-a", 81559, used_mib=19818, reserved_mib=479)])
    (gpu,) = NvmlSampler(nvml).sample().gpus
    assert (gpu.total_mib, gpu.used_mib, gpu.reserved_mib, gpu.free_mib) == (
        81559, 19818, 479, 81559 - 19818 - 479,
    )  # fmt: skip


def test_nvml_memory_not_supported_is_unknown_not_zero() -> None:
    """NVML_ERROR_NOT_SUPPORTED on the memory query (unified memory): None, and the rest of
    the device is read."""
    nvml = FakeNVML([LiveGPU("GPU-a", failing={"nvmlDeviceGetMemoryInfo": "NotSupported"})])
    sample = NvmlSampler(nvml).sample()
    (gpu,) = sample.gpus
    assert (gpu.total_mib, gpu.used_mib, gpu.reserved_mib) == (None, None, None)
    assert sample.problem == "" and gpu.processes == ()
