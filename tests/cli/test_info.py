"""``hwpool info`` rendering: the JSON dict and its text form, on a made-up machine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fakes.gpus import A100, H100_MIG, RTX, smi_script
from hwpool._cli._info import _cpus_json, cpu_list, format_info, gather
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
    assert mig["parent"] == H100_MIG.uuid and mig["memory_mib"] == 38146
    lines = format_info(json.loads(json.dumps(info))).splitlines()
    assert lines[0] == "GPUs: 4 (source: nvidia-smi)"  # before: "nvidia-smi; nvidia-smi"
    uuid = mig["uuid"]
    assert lines[1] == (
        f"  GPU 0: device {uuid} (NVIDIA H100 80GB HBM3 MIG 3g.40gb, 38146 MiB, "
        f"MIG instance of {H100_MIG.uuid})"
    )
    assert lines[4] == f"  GPU 3: device 1 (NVIDIA GeForce RTX 4090, {RTX.uuid}, 24564 MiB)"


def test_info_shows_memory_in_use_where_known(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([replace(RTX, used_mib=1536), A100]))  # A100: nvidia-smi says [N/A]
    info = gather()
    assert [d["memory_used_mib"] for d in info["gpus"]["devices"]] == [1536, None]
    lines = format_info(json.loads(json.dumps(info))).splitlines()
    assert lines[1] == (
        f"  GPU 0: device 0 (NVIDIA GeForce RTX 4090, {RTX.uuid}, 24564 MiB, 1536 MiB in use)"
    )
    assert lines[2] == f"  GPU 1: device 1 (NVIDIA A100-SXM4-80GB, {A100.uuid}, 81920 MiB)"


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
