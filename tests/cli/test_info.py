"""``hwpool info`` rendering: the JSON dict and its text form, on a made-up machine."""

from __future__ import annotations

import json
import os
import pwd
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fakes.gpus import A100, H100_MIG, RTX, smi_script
from fakes.live_nvml import FakeNVML, LiveGPU
from hwpool._cli._info import _cpus_json, cpu_list, format_info, gather, live_json
from hwpool._host._detect import detect_gpus
from hwpool._host._topology import CPUTopology, NumaNode

BIG_BOX = CPUTopology(
    online=tuple(range(8)),
    affinity=(0, 1, 2, 3, 4, 5),
    nodes=(NumaNode(0, (0, 1, 2, 3)), NumaNode(1, (4, 5, 6, 7))),
    smt_groups=((0, 4), (1, 5), (2, 6), (3, 7)),
    big_cores=(0, 1, 4, 5),
    cgroup_quota=2.5,
    usable=3,
)


def test_cpu_list_uses_kernel_ranges() -> None:
    assert cpu_list([5, 0, 1, 2]) == "0-2,5"
    assert cpu_list([3]) == "3"
    assert cpu_list([0, 2, 4, 5, 6, 9]) == "0,2,4-6,9"
    assert cpu_list([]) == "-"


def test_cpu_section_text() -> None:
    info = {
        "gpus": {"count": 0, "source": "cuda_visible_devices", "detail": "x", "devices": []},
        "cpus": _cpus_json(BIG_BOX, 3),
    }
    text = format_info(json.loads(json.dumps(info)))  # what --json users get back
    assert "CPUs: 3 usable (online 0-7; affinity 0-5; cgroup quota 2.5 CPUs)" in text
    assert "SMT: 4 cores with siblings" in text
    assert "big cores: 0-1,4-5" in text
    assert "NUMA node 1: CPUs 4-7" in text
    assert "CPUPool.from_env(): team of 3 threads (2 workers + the caller)" in text


def test_single_cpu_team_runs_serially() -> None:
    lone = CPUTopology((0,), (0,), (NumaNode(0, (0,)),), ((0,),), (), None, 1)
    info = {"gpus": {"count": 1, "source": "default", "detail": "", "devices": []}}
    text = format_info({**info, "cpus": _cpus_json(lone, 1)})
    assert "team of 1 thread (None: serial)" in text
    assert "SMT: off or absent" in text
    assert "cgroup quota none" in text


def test_gpu_devices_with_nvidia_smi_details() -> None:
    gpus = {
        "count": 1,
        "source": "nvidia-smi",
        "detail": "nvidia-smi",
        "devices": [{"index": 0, "device_id": "0", "uuid": "GPU-abc", "memory_mib": 81920}],
    }
    text = format_info({"gpus": gpus, "cpus": _cpus_json(BIG_BOX, 3)})
    assert "  GPU 0: device 0 (GPU-abc, 81920 MiB)" in text


def test_gather_live_machine_with_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPOOL_NUM_GPUS", "2")
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 65536)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    info = gather([str(data), str(empty)])
    assert info["gpus"]["count"] == 2
    assert info["cpus"]["usable"] >= 1
    assert info["cpus"]["cpu_pool_threads"] >= 1
    assert info["files"][1] == {"path": str(empty), "page_nodes": {}}
    assert all(n > 0 for n in info["files"][0]["page_nodes"].values())
    assert "none cached (or the file is empty)" in format_info(info)
    with pytest.raises(OSError):
        gather([str(tmp_path / "missing")])


def test_info_says_what_nvidia_smi_did(fake_smi) -> None:  # type: ignore[no-untyped-def]
    # Before: "no GPU found", whatever had happened to nvidia-smi.
    fake_smi("exit 9\n")
    info = gather()
    assert info["gpus"]["nvidia_smi"] == "nvidia-smi exited 9"
    first = format_info(info).splitlines()[0]
    assert first == "GPUs: 1 (source: default; no GPU found (nvidia-smi exited 9): 1 logical GPU)"


def test_info_shows_memory_names_and_mig(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([H100_MIG, RTX]))
    info = gather()
    mig = info["gpus"]["devices"][0]
    assert mig["parent"] == H100_MIG.uuid and mig["memory_mib"] == 40448
    assert mig["memory_group"] == f"{H100_MIG.uuid}/gi1"  # the fake's GPU instance of slot 0
    lines = format_info(json.loads(json.dumps(info))).splitlines()
    assert lines[0] == "GPUs: 4 (source: nvidia-smi)"
    assert lines[1].startswith(
        "  driver: unknown"
    )  # this fake nvidia-smi knows no --version  # before: "nvidia-smi; nvidia-smi"
    uuid = mig["uuid"]
    assert lines[2] == (
        f"  GPU 0: device {uuid} (NVIDIA H100 80GB HBM3 MIG 3g.40gb, 40448 MiB, "
        f"MIG instance of {H100_MIG.uuid})"
    )
    assert lines[5] == f"  GPU 3: device 1 (NVIDIA GeForce RTX 4090, {RTX.uuid}, 24564 MiB)"


def test_info_shows_memory_in_use_where_known(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([replace(RTX, used_mib=1536), A100]))  # A100: nvidia-smi says [N/A]
    info = gather()
    assert [d["memory_used_mib"] for d in info["gpus"]["devices"]] == [1536, None]
    lines = format_info(json.loads(json.dumps(info))).splitlines()
    assert lines[2] == (
        f"  GPU 0: device 0 (NVIDIA GeForce RTX 4090, {RTX.uuid}, 24564 MiB, 1536 MiB in use)"
    )
    assert lines[3] == f"  GPU 1: device 1 (NVIDIA A100-SXM4-80GB, {A100.uuid}, 81920 MiB)"


@pytest.mark.parametrize(
    ("source", "detail", "shown"),
    [
        ("nvml", "nvml", "source: nvml"),
        ("nvidia-smi", "nvidia-smi", "source: nvidia-smi"),
        ("nvidia-smi", "nvidia-smi (NVML failed: x)", "source: nvidia-smi (NVML failed: x)"),
        ("env", "HWPOOL_NUM_GPUS=2", "source: env; HWPOOL_NUM_GPUS=2"),
    ],
)  # fmt: skip
def test_info_names_its_source_once(source: str, detail: str, shown: str) -> None:
    info = gather()
    info["gpus"].update(source=source, detail=detail, devices=[])
    assert format_info(info).splitlines()[0] == f"GPUs: {info['gpus']['count']} ({shown})"


# ----------------------------------------------------------------- the GPUs' live state
GONE = 2**22 + 1  # above the kernel's pid_max: no such process
ME = pwd.getpwuid(os.getuid()).pw_name


def test_info_shows_the_gpus_live_state_from_nvidia_smi(fake_smi) -> None:  # type: ignore[no-untyped-def]
    busy = replace(
        RTX, used_mib=1536, utilization=37, processes=((os.getpid(), 1024), (GONE, None))
    )
    fake_smi(smi_script([busy, A100]))  # A100: used and utilisation [N/A], no process
    info = json.loads(json.dumps(gather()))  # what --json users get back
    live = info["gpus"]["live"]
    assert (live["source"], live["problem"]) == ("nvidia-smi", "")
    assert live["why"].startswith("watching with nvidia-smi (pynvml not installed")
    assert live["devices"] == [
        {
            "uuid": RTX.uuid, "memory_mib": 24564, "memory_used_mib": 1536,
            "memory_reserved_mib": None, "memory_free_mib": 24564 - 1536, "utilization": 37,
            "processes": [
                {"pid": os.getpid(), "user": ME, "memory_mib": 1024},
                {"pid": GONE, "user": None, "memory_mib": None},
            ],
        },
        {
            "uuid": A100.uuid, "memory_mib": 81920, "memory_used_mib": None,
            "memory_reserved_mib": None, "memory_free_mib": None, "utilization": None,
            "processes": [],
        },
    ]  # fmt: skip
    lines = format_info(info).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("GPUs now")))
    assert lines[start : start + 5] == [
        "GPUs now, read with nvidia-smi (pynvml not installed: pip install 'hwpool[nvml]'):",
        "  GPU 0: 1536 MiB / 24564 MiB used, 37% busy",
        f"    pid {os.getpid():>7}  {ME:<12} 1024 MiB",
        f"    pid {GONE:>7}  (gone)       ? MiB",
        "  GPU 1: ? MiB / 81920 MiB used, utilisation unknown",
    ]


def test_info_reads_the_live_state_through_nvml(
    fake_smi,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    fake_smi(smi_script([RTX]))
    found = detect_gpus(describe=True)  # through the fake nvidia-smi: pynvml is not there
    nvml = FakeNVML([LiveGPU(RTX.uuid, 24564, 3000, 55, {os.getpid(): 2048}, {GONE: 512})])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    live = live_json(found)
    assert live is not None and (live["source"], live["why"]) == ("nvml", "watching with NVML")
    [device] = live["devices"]
    assert (device["memory_used_mib"], device["utilization"]) == (3000, 55)
    assert device["processes"] == [
        {"pid": os.getpid(), "user": ME, "memory_mib": 2048},
        {"pid": GONE, "user": None, "memory_mib": 512},
    ]
    assert nvml.shutdowns == nvml.inits == 1  # initialised for this reading, and let go


def test_info_says_what_failed_in_the_live_reading(
    fake_smi,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    fake_smi(smi_script([RTX]))
    info = gather()
    nvml = FakeNVML([LiveGPU(RTX.uuid)])
    nvml.failing["nvmlDeviceGetCount"] = "GPU is lost"
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    info["gpus"]["live"] = live_json(detect_gpus(describe=True))
    assert info["gpus"]["live"]["devices"] == []
    line = next(line for line in format_info(info).splitlines() if line.startswith("GPUs now"))
    assert line.startswith("GPUs now, read with NVML: ") and "GPU is lost" in line


def test_info_reads_no_live_state_without_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPOOL_NUM_GPUS", "2")  # a count, no device that could be read
    info = gather()
    assert info["gpus"]["live"] is None
    assert not any(line.startswith("GPUs now") for line in format_info(info).splitlines())
