"""CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER read as CUDA reads them (issue 36).

Expected values come from NVIDIA's documentation: the CUDA Programming Guide, "CUDA
Environment Variables" (``CUDA_VISIBLE_DEVICES``: unset is every GPU, empty is none, the first
invalid entry ends the list, ``0,2,-1,1`` is GPUs 0 and 2, a UUID prefix that names one GPU;
``CUDA_DEVICE_ORDER``: ``FASTEST_FIRST`` by default, ``PCI_BUS_ID`` is nvidia-smi's order) and
the MIG User Guide, "CUDA Device Enumeration" (one MIG device per CUDA process; the
``MIG-<uuid>`` and older ``MIG-GPU-<uuid>/<gi>/<ci>`` forms). Where the documentation is silent
(a device listed twice, a list mixing kinds) the expected value is PyTorch's model of the
driver (``torch.cuda._parse_visible_devices``): a repeated device makes none visible.

Machines are real recordings, answered by a fake ``nvidia-smi`` (tests/fakes/mig_captures.py),
copied unchanged from ../shared/realgpu/captures/ into tests/fakes/captures/:

- ``linux-x86_64__nvidia-h100-mig__590.48.01.txt``: one H100 in MIG mode, four MIG devices
  (``MIG-00000000-...`` to ``MIG-00000003-...``; the default table puts MIG device 0 in GPU
  instance 2, compute instance 0);
- ``linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt``: one H100 (81559 MiB);
- ``linux-x86_64__nvidia-l40s__595.80.txt``: one L40S (46068 MiB).

The recordings mask every UUID to ``GPU-00000000-0000-0000-0000-000000000000``, so machines of
several GPUs are built from the recorded names and sizes with UUIDs of their own.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fakes.cuda import body, build_libcuda
from fakes.gpus import FakeGPU, smi_script
from fakes.mig_captures import CAPTURES, H100_MIG, answer, capture_smi
from hwpool import GPUInfo, GPUPool, GPUSource, detect_gpus
from hwpool._cli._info import gather
from hwpool._host._cuda import cuda_devices
from hwpool._host._visible import read_visible

H100 = CAPTURES / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
L40S = CAPTURES / "linux-x86_64__nvidia-l40s__595.80.txt"
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"  # the recordings' (masked) GPU UUID
MIG = [f"MIG-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(4)]  # the H100's -L
OLD_MIG = "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2"
SHOW = "import json, os; print(json.dumps(os.environ.get('CUDA_VISIBLE_DEVICES')))"

FakeSmi = Callable[[str], Path]


def recorded(capture: Path) -> tuple[str, int]:
    """The GPU's name and memory.total (MiB) as ``capture`` recorded them (idle query)."""
    query = ["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
    _status, line = answer(capture, "idle", query)
    name, mib = line.strip().split(", ")
    return name, int(mib)


def machine(*captures: Path) -> list[FakeGPU]:
    """GPUs with the recorded names and sizes, in this (PCI) order, each a UUID of its own."""
    return [
        FakeGPU(f"GPU-{i + 1:08x}-0000-0000-0000-000000000000", *recorded(c))
        for i, c in enumerate(captures)
    ]


def unchecked(raw: str) -> list[str]:
    """The entries ``raw`` makes visible where no hardware answered (taken as given)."""
    gpus, _note = read_visible(raw, None, None, _no_cuda)
    return [g.device_id for g in gpus]


def _no_cuda() -> tuple[tuple[str, ...] | None, str]:
    raise AssertionError("the CUDA driver must not be asked here")


# ----------------------------------------------------------------- the documented rules
@pytest.mark.parametrize(
    ("raw", "visible"),
    [
        ("2,1", ["2", "1"]),  # the Guide's example: 2 before 1, 0 hidden
        ("0,2,-1,1", ["0", "2"]),  # the Guide's example: -1 ends the list
        ("", []),  # set but empty: no GPU
        ("-1", []),
        ("NoDevFiles", []),  # what Slurm sets for a job that asked for no GPU
        (" 3 ", ["3"]),
        ("0,,1", ["0"]),
        ("1gpu", []),  # not an index: hwpool never reads more than CUDA can
        ("0,0", []),  # a device listed twice: none (PyTorch's model of the driver)
        ("GPU-8932f937,0", ["GPU-8932f937"]),  # one kind per list
        ("0,GPU-8932f937", ["0"]),
        ("MIG-aaaa,MIG-bbbb", ["MIG-aaaa"]),  # one MIG device per process
        (OLD_MIG, [OLD_MIG]),  # the older MIG form (GPU instance 1, compute instance 2)
    ],
)
def test_entries_without_hardware_to_check_them(raw: str, visible: list[str]) -> None:
    assert unchecked(raw) == visible


@pytest.mark.parametrize("raw", ["", "-1", "NoDevFiles", "0,0", "  "])
def test_no_visible_gpu_is_no_gpu(raw: str) -> None:
    # Before: "" and "-1" gave count 0 but GPUPool() still made one GPU "0" of it; "0,0"
    # gave two GPUs.
    found = detect_gpus({"CUDA_VISIBLE_DEVICES": raw})
    assert (found.source, found.count, found.gpus) == (GPUSource.CUDA_VISIBLE_DEVICES, 0, ())
    assert found.detail.startswith(f"CUDA_VISIBLE_DEVICES={raw!r}: ")
    assert found.detail.endswith("no GPU visible")


@pytest.mark.parametrize("raw", ["", "-1", "NoDevFiles"])
def test_gpu_pool_refuses_a_process_that_sees_no_gpu(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HWPOOL_NUM_GPUS", raising=False)
    monkeypatch.delenv("HWPOOL_SOCKET", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", raw)
    with pytest.raises(ValueError, match=rf"^GPUPool\(\): CUDA_VISIBLE_DEVICES={raw!r}: .*"
                       r"unset CUDA_VISIBLE_DEVICES or list the GPUs"):  # fmt: skip
        GPUPool()
    with pytest.raises(ValueError, match=rf"memory=True: CUDA_VISIBLE_DEVICES={raw!r}"):
        GPUPool(memory=True)
    assert GPUPool(2).num_gpus == 2  # logical GPUs, asked for by number, work as before


# ----------------------------------------------------------------- against real recordings
def test_an_index_the_machine_lacks_ends_the_list(fake_smi: FakeSmi) -> None:
    # Before: 1,7,2 on four GPUs was three GPUs; CUDA sees GPU 1 only.
    gpus = machine(H100, H100, H100, H100)
    fake_smi(smi_script(gpus))
    found = detect_gpus({"CUDA_VISIBLE_DEVICES": "1,7,2"})
    assert [(g.device_id, g.uuid) for g in found.gpus] == [("1", gpus[1].uuid)]
    assert "entry '7' is out of range (this machine has 4 GPUs)" in found.detail
    assert "'7,2' left out" in found.detail


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", [("0", GPU0, 81559)]),
        ("GPU-0", [("GPU-0", GPU0, 81559)]),  # a prefix naming one GPU
        (GPU0, [(GPU0, GPU0, 81559)]),
        ("0,1", [("0", GPU0, 81559)]),  # one GPU: index 1 is invalid
        ("1,0", []),
        (f"{GPU0},GPU-1", [(GPU0, GPU0, 81559)]),  # a UUID no GPU has ends the list
        ("0,GPU-0", [("0", GPU0, 81559)]),  # one kind per list
        (f"0,{GPU0}", [("0", GPU0, 81559)]),
        (f"GPU-0,{GPU0}", []),  # one device twice
    ],
)
def test_whole_gpu_entries_on_the_recorded_h100(
    fake_smi: FakeSmi, raw: str, expected: list[tuple[str, str, int]]
) -> None:
    """The H100 recording: the device each entry names, with the recorded UUID and size."""
    fake_smi(capture_smi(H100, "idle"))
    found = detect_gpus({"CUDA_VISIBLE_DEVICES": raw})
    assert [(g.device_id, g.uuid, g.memory_mib) for g in found.gpus] == expected
    assert [g.index for g in found.gpus] == list(range(len(expected)))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (MIG[1], [(MIG[1], MIG[1])]),
        ("MIG-00000002", [("MIG-00000002", MIG[2])]),  # a prefix naming one MIG device
        ("MIG-0000000", []),  # the prefix of all four: ambiguous, invalid
        (f"{MIG[1]},{MIG[2]}", [(MIG[1], MIG[1])]),  # one MIG device per process
        (f"{MIG[3]},0", [(MIG[3], MIG[3])]),
        ("MIG-ffffffff", []),
        # The older form names the GPU instance and compute instance: kept as given.
        (f"MIG-{GPU0}/2/0", [(f"MIG-{GPU0}/2/0", None)]),
        ("MIG-GPU-11111111-0000-0000-0000-000000000000/2/0", []),  # no such GPU
        ("0", [("0", None)]),  # the GPU is there (index in range), in MIG mode
        ("1", []),
    ],
)
def test_mig_entries_on_the_recorded_h100_in_mig_mode(
    fake_smi: FakeSmi, raw: str, expected: list[tuple[str, str | None]]
) -> None:
    fake_smi(capture_smi(H100_MIG, "idle"))
    found = detect_gpus({"CUDA_VISIBLE_DEVICES": raw})
    assert [(g.device_id, g.uuid) for g in found.gpus] == expected
    assert all(g.parent == GPU0 for g in found.gpus if g.uuid)


def test_neither_nvml_nor_nvidia_smi_takes_entries_as_given(fake_smi: FakeSmi) -> None:
    found = detect_gpus({"CUDA_VISIBLE_DEVICES": "3,7"})  # no nvidia-smi on PATH
    assert found.gpus == (GPUInfo(0, "3"), GPUInfo(1, "7"))
    assert found.nvidia_smi == "nvidia-smi not found on PATH"


# ----------------------------------------------------------------- children get UUIDs
def test_a_real_child_is_given_the_uuid_not_the_index(
    fake_smi: FakeSmi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the child of CUDA_VISIBLE_DEVICES=0 was given "0" (and of a prefix, the prefix).
    fake_smi(capture_smi(H100, "idle"))
    for entry in ("0", "GPU-0000"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", entry)
        lease = GPUPool().lease(0.5)
        with lease:
            assert lease.devices == [GPU0]
            proc = lease.run([sys.executable, "-c", SHOW], capture_output=True, text=True,
                             timeout=30)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == GPU0


# ----------------------------------------------------------------- CUDA_DEVICE_ORDER
@pytest.fixture
def libcuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake CUDA driver on LD_LIBRARY_PATH (skipped without a C compiler)."""
    folder = tmp_path / "cuda"
    folder.mkdir()
    library = build_libcuda(folder)
    if library is None:
        pytest.skip("no C compiler (cc) to build the fake libcuda.so.1")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(folder))
    monkeypatch.setenv("FAKE_CUDA_LOG", str(tmp_path / "cuinit.log"))
    return library


def test_indexes_on_different_gpus_are_numbered_by_the_cuda_driver(
    fake_smi: FakeSmi, libcuda: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # nvidia-smi (PCI order): 0 is the L40S, 1 the H100. CUDA (fastest first): 0 is the H100.
    # Before: CUDA_VISIBLE_DEVICES=0 was taken as nvidia-smi's 0, the L40S, and the child was
    # sent to the card its parent did not have.
    l40s, h100 = machine(L40S, H100)
    fake_smi(smi_script([l40s, h100]))
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("FAKE_CUDA_DEVICES", body(h100.uuid))  # what CUDA enumerates
    (gpu,) = detect_gpus().gpus
    assert (gpu.device_id, gpu.uuid, gpu.name, gpu.memory_mib) == (
        "0", h100.uuid, "NVIDIA H100 80GB HBM3", 81559)  # fmt: skip
    # The driver was initialised in a child process, never in this one.
    (line,) = (tmp_path / "cuinit.log").read_text().splitlines()
    assert line.startswith("cuInit ") and int(line.split()[1]) != os.getpid()
    assert "libcuda" not in Path("/proc/self/maps").read_text()


def test_pci_bus_order_needs_no_driver(fake_smi: FakeSmi, monkeypatch: pytest.MonkeyPatch) -> None:
    l40s, h100 = machine(L40S, H100)
    fake_smi(smi_script([l40s, h100]))
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert [g.uuid for g in detect_gpus().gpus] == [h100.uuid, l40s.uuid]


def test_identical_gpus_need_no_driver(fake_smi: FakeSmi, monkeypatch: pytest.MonkeyPatch) -> None:
    # FASTEST_FIRST has nothing to rank identical GPUs by: CUDA's order is the PCI order.
    gpus = machine(H100, H100)
    fake_smi(smi_script(gpus))
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [g.uuid for g in detect_gpus().gpus] == [gpus[1].uuid]


@pytest.mark.parametrize("order", [None, "FASTEST_FIRST"])
def test_indexes_on_different_gpus_without_a_driver_are_refused(
    fake_smi: FakeSmi, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, order: str | None
) -> None:
    fake_smi(smi_script(machine(L40S, H100)))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))  # no libcuda.so.1 there
    if cuda_devices(dict(os.environ))[0] is not None:
        pytest.skip("this machine has a CUDA driver: it would answer")
    if order is None:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    setting = re.escape("unset (CUDA's default, FASTEST_FIRST)" if order is None else repr(order))
    message = (
        rf"CUDA_VISIBLE_DEVICES='0' names GPUs by index with CUDA_DEVICE_ORDER {setting}(.|\n)*"
        r"NVIDIA H100 80GB HBM3, NVIDIA L40S(.|\n)*libcuda.so.1 did not load(.|\n)*"
        r"Set CUDA_DEVICE_ORDER=PCI_BUS_ID"
    )
    with pytest.raises(ValueError, match=message):
        detect_gpus()
    with pytest.raises(ValueError, match="Set CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        GPUPool()
    # hwpool info, a doctor, shows the GPUs in PCI order and the refusal as a problem, with
    # the fix (before: it stopped with the refusal).
    info = gather()
    assert [d["name"] for d in info["gpus"]["devices"]] == ["NVIDIA L40S"]
    (problem,) = [p for p in info["problems"] if p["where"] == "CUDA_VISIBLE_DEVICES"]
    assert re.match(message, problem["problem"]) and "PCI_BUS_ID" in problem["fix"]


def test_a_failing_driver_is_refused_with_its_status(
    fake_smi: FakeSmi, libcuda: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_smi(smi_script(machine(L40S, H100)))
    monkeypatch.setenv("FAKE_CUDA_INIT", "999")  # CUDA_ERROR_UNKNOWN
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ValueError, match=r"cuInit failed \(CUresult 999\)"):
        detect_gpus()


def test_the_probe_reads_the_fake_driver_as_ctypes_sees_it(libcuda: Path) -> None:
    env = {"LD_LIBRARY_PATH": str(libcuda.parent), "FAKE_CUDA_DEVICES": "0123456789abcdef" * 2}
    uuids, what = cuda_devices(env)
    assert uuids == ("01234567-89ab-cdef-0123-456789abcdef",)
    assert what == "the CUDA driver enumerated 1 device(s)"
    assert cuda_devices({"LD_LIBRARY_PATH": str(libcuda.parent)})[0] == ()
    missing = cuda_devices({"LD_LIBRARY_PATH": "/nonexistent"})
    assert missing[0] is None and missing[1].startswith("libcuda.so.1 did not load")
