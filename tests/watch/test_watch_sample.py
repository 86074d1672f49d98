"""Sampling the GPUs: NVML (a fake pynvml whose machine changes between samples) and
nvidia-smi (the fake script), and the choice between them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from fakes.gpus import A100, RTX, smi_script
from fakes.live_nvml import FakeNVML, LiveGPU
from hwpool._watch import GPUProcess, GPUReading, NvmlSampler, SmiSampler, open_sampler

A, B = "GPU-aaaa", "GPU-bbbb"


def machine() -> FakeNVML:
    return FakeNVML(
        [
            LiveGPU(A, 81920, 5000, 37, processes={101: 3000, 102: 1999}),
            LiveGPU(B, 24564, 0, 0),
        ]
    )


def test_nvml_reads_memory_utilisation_and_processes() -> None:
    sample = NvmlSampler(machine()).sample()
    assert sample.source == "nvml" and sample.problem == ""
    procs = (GPUProcess(101, A, 3000), GPUProcess(102, A, 1999))
    assert sample.gpus == (GPUReading(A, 81920, 5000, 37, procs), GPUReading(B, 24564, 0, 0, ()))
    assert sample.processes == procs


def test_nvml_follows_processes_appearing_and_disappearing() -> None:
    nvml = machine()
    sampler = NvmlSampler(nvml)
    sampler.sample()
    nvml.gpus[1].processes[201] = 512
    del nvml.gpus[0].processes[101]
    nvml.gpus[1].utilization = 90
    sample = sampler.sample()
    assert [(p.pid, p.gpu) for p in sample.processes] == [(102, A), (201, B)]
    assert sample.gpus[1].utilization == 90
    assert nvml.inits == 1  # initialised once, not per sample


def test_nvml_process_in_both_lists_counts_once_and_unknown_memory_is_none() -> None:
    nvml = machine()
    nvml.gpus[0].graphics = {101: 3500, 103: 128}
    nvml.gpus[1].processes = {301: None}
    sample = NvmlSampler(nvml).sample()
    assert [(p.pid, p.used_mib) for p in sample.processes] == [
        (101, 3500),
        (102, 1999),
        (103, 128),
        (301, None),
    ]


def test_an_nvml_error_on_one_gpu_makes_only_that_value_unknown_for_one_sample() -> None:
    nvml = machine()
    sampler = NvmlSampler(nvml)
    nvml.gpus[0].failing["nvmlDeviceGetComputeRunningProcesses"] = "GPU is lost"
    nvml.gpus[1].failing["nvmlDeviceGetUtilizationRates"] = "Unknown Error"
    sample = sampler.sample()
    assert sample.gpus[0].processes is None and sample.gpus[0].used_mib == 5000
    assert sample.gpus[1].utilization is None and sample.gpus[1].processes == ()
    assert "GPU-aaaa: nvmlDeviceGetComputeRunningProcesses failed (NVMLError: GPU is lost)" in (
        sample.problem
    )
    nvml.gpus[0].failing.clear()
    nvml.gpus[1].failing.clear()
    again = sampler.sample()
    assert again.problem == "" and len(again.processes) == 2


def test_an_nvml_failure_listing_devices_is_an_unknown_sample_then_nvml_starts_again() -> None:
    nvml = machine()
    sampler = NvmlSampler(nvml)
    sampler.sample()
    nvml.failing["nvmlDeviceGetCount"] = "Driver Not Loaded"
    sample = sampler.sample()
    assert sample.gpus == () and sample.problem == "NVML failed (NVMLError: Driver Not Loaded)"
    assert nvml.shutdowns == 1
    del nvml.failing["nvmlDeviceGetCount"]
    assert len(sampler.sample().gpus) == 2 and nvml.inits == 2


def test_nvml_that_cannot_start_gives_an_unknown_sample() -> None:
    nvml = machine()
    nvml.failing["nvmlInit"] = "Driver Not Loaded"
    sample = NvmlSampler(nvml).sample()
    assert sample.gpus == () and sample.problem.startswith("NVML failed at init")


def test_nvml_mig_instances_stand_in_for_their_gpu_without_utilisation() -> None:
    mig = LiveGPU("MIG-1111", 40448, 100, 55, processes={7: 100})
    nvml = FakeNVML([LiveGPU(A, 81920, 100, 55, migs=[mig])])
    sample = NvmlSampler(nvml).sample()
    assert sample.gpus == (
        GPUReading("MIG-1111", 40448, 100, None, (GPUProcess(7, "MIG-1111", 100),)),
    )


def test_close_shuts_nvml_down_once() -> None:
    nvml = machine()
    sampler = NvmlSampler(nvml)
    sampler.sample()
    sampler.close()
    sampler.close()
    assert nvml.shutdowns == 1


def test_open_sampler_uses_nvml_where_pynvml_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", machine())
    sampler, why = open_sampler()
    assert isinstance(sampler, NvmlSampler) and why == "watching with NVML"
    sampler.close()


def test_open_sampler_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    sampler, why = open_sampler()
    assert isinstance(sampler, SmiSampler) and "pynvml not installed" in why
    broken = machine()
    broken.failing["nvmlInit"] = "Driver Not Loaded"
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    sampler, why = open_sampler()
    assert isinstance(sampler, SmiSampler)
    assert why == "watching with nvidia-smi (NVML failed at init (NVMLError: Driver Not Loaded))"


BUSY_A100 = replace(A100, used_mib=9000, utilization=80, processes=((4242, 6000), (4243, None)))
IDLE_RTX = replace(RTX, used_mib=0, utilization=None)


def test_nvidia_smi_reads_memory_utilisation_and_processes(
    fake_smi: Callable[[str], Path],
) -> None:
    fake_smi(smi_script([BUSY_A100, IDLE_RTX]))
    sample = SmiSampler().sample()
    a, r = A100.uuid, RTX.uuid
    procs = (GPUProcess(4242, a, 6000), GPUProcess(4243, a, None))
    assert sample.source == "nvidia-smi" and sample.problem == ""
    assert sample.gpus == (GPUReading(a, 81920, 9000, 80, procs), GPUReading(r, 24564, 0, None, ()))


def test_nvidia_smi_missing_or_garbled_is_an_unknown_sample(
    fake_smi: Callable[[str], Path],
) -> None:
    assert SmiSampler().sample().problem == "nvidia-smi not found on PATH"
    fake_smi("echo 'Failed to initialize NVML: Driver/library version mismatch'\n")
    sample = SmiSampler().sample()
    assert sample.gpus == () and sample.problem == "nvidia-smi printed an unexpected CSV"
    fake_smi("exit 9\n")
    assert SmiSampler().sample().problem == "nvidia-smi exited 9"


def test_nvidia_smi_process_query_failing_leaves_the_gpus_known(
    fake_smi: Callable[[str], Path],
) -> None:
    body = smi_script([BUSY_A100]).replace("--query-compute-apps=gpu_uuid", "--nothing")
    fake_smi(body)
    sample = SmiSampler().sample()
    assert sample.gpus[0].used_mib == 9000 and sample.gpus[0].processes is None
    assert sample.problem == "processes unknown: nvidia-smi exited 2"


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf")])
def test_a_bad_nvidia_smi_timeout_names_the_argument_and_value(timeout: float) -> None:
    with pytest.raises(ValueError) as raised:
        SmiSampler(timeout)
    assert str(raised.value) == f"timeout must be > 0 and finite, got {timeout!r}"


def test_the_watcher_imports_no_pynvml_until_asked(tmp_path: Path) -> None:
    (tmp_path / "pynvml.py").write_text("raise RuntimeError('pynvml imported')\n")
    code = "import sys, hwpool._watch; print('pynvml' in sys.modules)"
    src = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": f"{src}:{tmp_path}"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "False\n"), done.stderr
