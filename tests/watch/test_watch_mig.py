"""The watcher sees use on MIG devices (issue 36).

nvidia-smi's ``--query-compute-apps`` lists a MIG device's processes under its parent GPU's
UUID; the default table's "Processes" section gives each one's GPU instance (GI) and compute
instance (CI), and its "MIG devices" section which MIG device each (GI, CI) is. The tests
answer from the real recordings in ``tests/fakes/captures/`` (copied unchanged):

- ``linux-x86_64__nvidia-h200-mig__590.48.01.txt`` (load): three processes (12249, 12250,
  12267: 2194, 1170 and 13526 MiB) on GI 2, CI 1, which is MIG device 1
  (``MIG-00000001-...``), a compute instance that shares GI 2 with MIG device 0;
- ``linux-x86_64__nvidia-h100-mig__590.48.01.txt`` (load): three processes on GI 2, CI 0,
  MIG device 0.

NVML lists processes per MIG handle; as a non-root user the parent's MIG queries may answer
NVML_ERROR_NO_PERMISSION, and the MIG handles are looked up by index anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fakes.live_nvml import FakeNVML, LiveGPU
from fakes.mig_captures import H100_MIG, H200_MIG, capture_smi
from hwpool._watch._attribute import Attributed, outside_mib
from hwpool._watch._nvml import NvmlSampler
from hwpool._watch._sample import GPUProcess, GPUReading
from hwpool._watch._smi import SmiSampler


def mig(n: int) -> str:
    return f"MIG-0000000{n}-0000-0000-0000-00000000000{n}"


def test_nvidia_smi_attributes_mig_processes_to_their_mig_device(
    fake_smi: Callable[[str], Path],
) -> None:
    fake_smi(capture_smi(H200_MIG, "load"))
    sample = SmiSampler().sample()
    assert sample.problem == ""
    on_1 = (GPUProcess(12249, mig(1), 2194), GPUProcess(12250, mig(1), 1170),
            GPUProcess(12267, mig(1), 13526))  # fmt: skip
    assert sample.gpus == (
        GPUReading(mig(0), 71424, 16925, None, ()),
        GPUReading(mig(1), 71424, 16925, None, on_1),
        GPUReading(mig(2), 33280, 17, None, ()),
        GPUReading(mig(3), 16384, 9, None, ()),
        GPUReading(mig(4), 16384, 9, None, ()),
    )
    outside = [Attributed(p, None, None, "") for p in sample.processes]
    assert outside_mib(sample, outside) == {
        mig(0): 0, mig(1): 16890, mig(2): 0, mig(3): 0, mig(4): 0,
    }  # fmt: skip


def test_nvidia_smi_on_the_h100_mig_capture(fake_smi: Callable[[str], Path]) -> None:
    fake_smi(capture_smi(H100_MIG, "load"))
    sample = SmiSampler().sample()
    assert [(g.uuid, g.total_mib, len(g.processes or ())) for g in sample.gpus] == [
        (mig(0), 40448, 3), (mig(1), 20096, 0), (mig(2), 9984, 0), (mig(3), 9984, 0),
    ]  # fmt: skip
    assert {p.pid for p in sample.processes} == {21180, 21181, 21198}


def test_nvidia_smi_idle_mig_devices_have_no_processes(fake_smi: Callable[[str], Path]) -> None:
    fake_smi(capture_smi(H200_MIG, "idle"))
    sample = SmiSampler().sample()
    assert [g.uuid for g in sample.gpus] == [mig(n) for n in range(5)]
    assert sample.processes == ()


def test_nvidia_smi_without_its_table_leaves_mig_devices_unknown(
    fake_smi: Callable[[str], Path],
) -> None:
    fake_smi(f"[ $# -eq 0 ] && exit 9\n{capture_smi(H200_MIG, 'load')}")
    sample = SmiSampler().sample()
    assert sample.gpus == tuple(GPUReading(mig(n), None, None, None, None) for n in range(5))
    assert sample.problem == "MIG devices' memory unknown: nvidia-smi exited 9"


def test_nvml_non_root_lists_mig_devices_when_the_parent_will_not_say() -> None:
    """The parent's MIG mode answers "Insufficient Permissions": its MIG devices are looked
    up by index anyway, and each lists its own processes."""
    first = LiveGPU("MIG-1111", 40448, 3000, 0, processes={7: 3000})
    second = LiveGPU("MIG-2222", 40448, 3000, 0, processes={8: 100})
    parent = LiveGPU("GPU-aaaa", 81920, None, 0, migs=[first, second],
                     failing={"nvmlDeviceGetMigMode": "Insufficient Permissions",
                              "nvmlDeviceGetMemoryInfo": "Insufficient Permissions"})  # fmt: skip
    sample = NvmlSampler(FakeNVML([parent])).sample()
    assert sample.problem == ""
    assert [(g.uuid, [p.pid for p in g.processes or ()]) for g in sample.gpus] == [
        ("MIG-1111", [7]),
        ("MIG-2222", [8]),
    ]
