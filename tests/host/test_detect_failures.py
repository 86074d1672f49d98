"""Detection when the driver fails: one failing GPU is left out and named, the rest are used;
nvidia-smi's own message reaches the user; unknown values stay None.

NVML's behaviour is its documented return codes (NVML API reference, nvmlReturn_t and the
device queries), raised as nvidia-ml-py's classes (tests/fakes/nvml_errors.py); nvidia-smi's
messages are those of public bug reports, quoted beside each case.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from fakes.gpus import H100_MIG, FakeGPU
from hwpool import GPUInfo, GPUSource, detect_gpus, gpu_memory_in_use

A = FakeGPU("GPU-aaaaaaaa-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", 81559)
B = FakeGPU("GPU-bbbbbbbb-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", 81559)
C = FakeGPU("GPU-cccccccc-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3", 81559)

FakeNvml = Callable[..., ModuleType]
FakeSmi = Callable[[str], Path]


@pytest.mark.parametrize(
    ("status", "printed", "said"),
    [
        # mozilla/translations#1167 (exit 18, on stdout), anderskm/gputil#55
        (
            18,
            "Failed to initialize NVML: Driver/library version mismatch\n"
            "NVML library version: 550.144\n",
            "Failed to initialize NVML: Driver/library version mismatch; "
            "NVML library version: 550.144",
        ),
        # NVIDIA/nvidia-docker#988 (the driver not loaded: nvidia-smi documents exit 9)
        (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
        ),
        # NVIDIA/open-gpu-kernel-modules#862 (exit 6: "query unsuccessful")
        (6, "No devices were found\n", "No devices were found"),
    ],
)
def test_nvidia_smis_own_message_reaches_the_user(
    fake_smi: FakeSmi, status: int, printed: str, said: str
) -> None:
    """Before: "nvidia-smi exited 18", the reason lost."""
    fake_smi(f"cat <<'EOF'\n{printed}EOF\nexit {status}\n")
    found = detect_gpus()
    assert found.source == GPUSource.DEFAULT
    assert found.nvidia_smi == f"nvidia-smi exited {status}: {said}"
    assert said in found.detail


def test_a_message_on_stderr_is_kept_too(fake_smi: FakeSmi) -> None:
    fake_smi("echo 'Failed to initialize NVML: Unknown Error' >&2\nexit 255\n")
    assert (
        detect_gpus().nvidia_smi
        == "nvidia-smi exited 255: Failed to initialize NVML: Unknown Error"
    )


LOST = "Unable to determine the device handle for GPU 0000:82:00.0: GPU is lost.  Reboot the system to recover this GPU"  # noqa: E501  (JosephKJ/OWOD#81, as printed)


@pytest.mark.parametrize(("status", "stream"), [(0, ""), (15, ""), (15, " >&2")])
def test_a_lost_gpu_is_named_and_the_others_are_used(
    fake_smi: FakeSmi, status: int, stream: str
) -> None:
    """nvidia-smi names the GPU it cannot reach among the others' rows (exit 15 is its
    documented "GPU has fallen off the bus"), on stdout or stderr. Before: the whole answer
    was refused."""
    fake_smi(
        f"echo '0, {A.uuid}, {A.name}, 81559, 0, 479'\necho '{LOST}'{stream}\n"
        f"echo '2, {C.uuid}, {C.name}, 81559, 10, 479'\nexit {status}\n"
    )
    found = detect_gpus()
    assert found.source == GPUSource.NVIDIA_SMI
    assert [(g.index, g.device_id, g.uuid) for g in found.gpus] == [
        (0, "0", A.uuid),
        (1, "2", C.uuid),
    ]
    assert found.failed == (
        ("GPU 0000:82:00.0", "GPU is lost. Reboot the system to recover this GPU"),
    )
    assert "left out GPU 0000:82:00.0 (GPU is lost." in (found.nvidia_smi or "")


def test_a_driver_without_memory_reserved_is_asked_without_it(
    fake_smi: FakeSmi, tmp_path: Path
) -> None:
    """A driver that does not know a field refuses the whole query (exit 2, 'Field "..." is
    not a valid field to query.'): it is asked again without ``memory.reserved``."""
    fake_smi(
        f'echo "$1" >> {tmp_path}/args\n'
        'case "$1" in *memory.reserved*) echo \'Field "memory.reserved" is not a valid field to '
        "query.'; exit 2 ;; esac\n"
        f'[ "$1" = -L ] && exit 0\necho "0, {A.uuid}, {A.name}, 81559, 1024"\n'
    )
    (gpu,) = detect_gpus().gpus
    assert (gpu.memory_mib, gpu.memory_used_mib, gpu.memory_reserved_mib) == (81559, 1024, None)
    assert len((tmp_path / "args").read_text().splitlines()) == 3  # new query, old one, -L


@pytest.mark.parametrize(
    ("function", "error", "why"),
    [
        ("nvmlDeviceGetHandleByIndex", "GpuIsLost", "NVMLError_GpuIsLost: GPU is lost"),
        ("nvmlDeviceGetHandleByIndex", "Unknown", "NVMLError_Unknown: Unknown Error"),
        ("nvmlDeviceGetUUID", "GpuIsLost", "NVMLError_GpuIsLost: GPU is lost"),
        ("nvmlDeviceGetMemoryInfo", "Unknown", "NVMLError_Unknown: Unknown Error"),
    ],
)
def test_one_failing_gpu_through_nvml_is_left_out_and_named(
    fake_nvml: FakeNvml, function: str, error: str, why: str
) -> None:
    """NVML answers for each device apart (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN on one
    handle). Before: NVML failed as a whole and detection fell to nvidia-smi (here none)."""
    fake_nvml([A, FakeGPU(B.uuid, B.name, 81559, failing={function: error}), C])
    found = detect_gpus()
    assert found.source == GPUSource.NVML
    assert [(g.device_id, g.uuid) for g in found.gpus] == [("0", A.uuid), ("2", C.uuid)]
    assert found.failed == (("device 1", why),)
    assert found.nvml == f"NVML listed 3 GPUs; left out device 1 ({why})"


def test_every_gpu_failing_falls_back_to_nvidia_smi_and_keeps_the_names(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml([FakeGPU(A.uuid, A.name, 81559, failing={"nvmlDeviceGetHandleByIndex": "GpuIsLost"})])
    found = detect_gpus()
    assert found.source == GPUSource.DEFAULT
    assert found.failed == (("device 0", "NVMLError_GpuIsLost: GPU is lost"),)


def test_memory_not_supported_keeps_the_gpu_with_memory_unknown(fake_nvml: FakeNvml) -> None:
    """Unified memory (GB10): nvmlDeviceGetMemoryInfo answers NVML_ERROR_NOT_SUPPORTED. The
    GPU is used, its memory unknown (None), never 0. Before: NVML failed as a whole."""
    gb10 = FakeGPU(A.uuid, "NVIDIA GB10", 0, failing={"nvmlDeviceGetMemoryInfo": "NotSupported"})
    fake_nvml([gb10])
    found = detect_gpus()
    assert (found.source, found.failed) == (GPUSource.NVML, ())
    assert found.gpus == (GPUInfo(0, "0", A.uuid, None, "NVIDIA GB10"),)


def test_mig_parent_without_permission_keeps_its_instances(fake_nvml: FakeNvml) -> None:
    """In MIG mode the parent's memory is "aggregate information, only if the caller has
    appropriate privileges" (nvmlDeviceGetMemoryInfo): NVML_ERROR_NO_PERMISSION for a user.
    Before: NVML failed as a whole for non-root."""
    parent = FakeGPU(
        H100_MIG.uuid, H100_MIG.name, H100_MIG.memory_mib, H100_MIG.migs,
        failing={"nvmlDeviceGetMemoryInfo": "NoPermission"},
    )  # fmt: skip
    fake_nvml([parent])
    found = detect_gpus()
    assert (found.source, found.failed) == (GPUSource.NVML, ())
    assert [g.memory_mib for g in found.gpus] == [40448, 20096, 9856]
    assert all(g.parent == H100_MIG.uuid for g in found.gpus)


def test_nvml_v2_memory_gives_reserved_apart(fake_nvml: FakeNvml) -> None:
    """nvmlDeviceGetMemoryInfo_v2: ``reserved`` apart from ``used`` (nvmlMemory_v2_t)."""
    fake_nvml([FakeGPU(A.uuid, A.name, 81559, used_mib=19818, reserved_mib=479)])
    (gpu,) = detect_gpus().gpus
    assert (gpu.memory_mib, gpu.memory_used_mib, gpu.memory_reserved_mib) == (81559, 19818, 479)
    assert gpu.memory_free_mib == 81559 - 19818 - 479


def test_nvml_without_v2_counts_reserved_in_used(fake_nvml: FakeNvml) -> None:
    """A driver without nvmlDeviceGetMemoryInfo_v2 (NVML_ERROR_FUNCTION_NOT_FOUND): the
    original record, whose ``used`` is "Sum of Reserved and Allocated" (nvmlMemory_t)."""
    nvml = fake_nvml([FakeGPU(A.uuid, A.name, 81559, used_mib=19818)])
    assert hasattr(nvml, "nvmlMemory_v2")
    (gpu,) = detect_gpus().gpus
    assert (gpu.memory_used_mib, gpu.memory_reserved_mib) == (19818, None)
    assert gpu.memory_free_mib == 81559 - 19818


def test_memory_in_use_of_the_others_is_read_past_a_lost_gpu(fake_smi: FakeSmi) -> None:
    """``gpu_memory_in_use`` through nvidia-smi with one GPU lost: the others' use is read,
    the lost one's is unknown (None). Before: None for every GPU."""
    fake_smi(
        'case "$1" in --query-gpu=uuid,memory.used) '
        f"printf '%s\\n' '{A.uuid}, 1024' '{LOST}'; exit 15 ;;\n"
        f"-L) exit 0 ;;\n*) printf '%s\\n' '0, {A.uuid}, {A.name}, 81559, 0, 479' "
        f"'1, {B.uuid}, {B.name}, 81559, 0, 479' ;; esac\n"
    )
    gpus = detect_gpus().gpus
    assert gpu_memory_in_use(gpus) == (1024, None)
