"""Detection fed what real drivers print: a fake nvidia-smi answering from recordings.

Each capture is in tests/fakes/captures/ (copied unchanged from ../shared/realgpu/captures/;
see tests/fakes/recorded_smi.py). The expected values are written from the capture text (its
``--query-gpu`` CSV and ``-L`` listing), quoted beside each case, not from what hwpool prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fakes import recorded_smi
from fakes.recorded_smi import (
    H100,
    H100_MIG,
    H200,
    H200_MIG,
    L40S,
    RTX_2080_SUPER_WINDOWS,
    RTX_4080_SUPER,
    Capture,
)
from hwpool import GPUPool, GPUSource, detect_gpus

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"  # the captures mask every UUID so

Install = Callable[..., Path]


@pytest.fixture
def recorded(fake_smi: Callable[[str], Path], tmp_path: Path) -> Install:
    """Install the recorded nvidia-smi for a capture (``fake_smi`` set PATH and hid pynvml)."""

    def install(capture: str, phase: str = "load") -> Path:
        return recorded_smi.install(tmp_path, capture, phase, log=tmp_path / "args")

    return install


# (capture, phase, name, memory.total, memory.used, memory.reserved) as recorded, in MiB.
WHOLE_GPUS = [
    # linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt, load: "81559 MiB, 479 MiB, 19818 MiB"
    (H100, "load", "NVIDIA H100 80GB HBM3", 81559, 19818, 479),
    # ... idle: "81559 MiB, 479 MiB, 0 MiB, 81081 MiB"
    (H100, "idle", "NVIDIA H100 80GB HBM3", 81559, 0, 479),
    # linux-x86_64__nvidia-h200__590.48.01.txt, load: "143771 MiB, 614 MiB, 32362 MiB"
    (H200, "load", "NVIDIA H200", 143771, 32362, 614),
    # linux-x86_64__nvidia-l40s__595.80.txt, load: "46068 MiB, 609 MiB, 1235 MiB"
    (L40S, "load", "NVIDIA L40S", 46068, 1235, 609),
    # linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt, load: "16376, 434, 1474"
    (RTX_4080_SUPER, "load", "NVIDIA GeForce RTX 4080 SUPER", 16376, 1474, 434),
    # windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt, idle: "8192, 205, 797"
    (RTX_2080_SUPER_WINDOWS, "idle", "NVIDIA GeForce RTX 2080 SUPER", 8192, 797, 205),
]


@pytest.mark.parametrize("case", WHOLE_GPUS)
def test_whole_gpus_as_recorded(
    recorded: Install, case: tuple[str, str, str, int, int, int]
) -> None:
    """Name, UUID, total, used and reserved memory as each machine's nvidia-smi printed them.

    Before: ``memory.reserved`` was not asked, so the driver's own memory counted as free.
    """
    capture, phase, name, total, used, reserved = case
    recorded(capture, phase)
    found = detect_gpus()
    assert (found.count, found.source, found.failed) == (1, GPUSource.NVIDIA_SMI, ())
    (gpu,) = found.gpus
    assert (gpu.device_id, gpu.uuid, gpu.name, gpu.parent) == ("0", GPU0, name, None)
    assert (gpu.memory_mib, gpu.memory_used_mib, gpu.memory_reserved_mib) == (
        total,
        used,
        reserved,
    )
    assert gpu.memory_free_mib == total - used - reserved


def test_free_is_what_the_driver_says_give_or_take_its_rounding(recorded: Install) -> None:
    """nvidia-smi rounds each figure apart: the recorded ``memory.free`` (61263 MiB on the
    loaded H100) is within 2 MiB of total - used - reserved (61262), never far from it."""
    recorded(H100, "load")
    (gpu,) = detect_gpus().gpus
    recorded_free = int(Capture(H100).value("load", "memory.free").removesuffix(" MiB"))
    assert recorded_free == 61263
    assert gpu.memory_free_mib is not None and 0 <= recorded_free - gpu.memory_free_mib <= 2


def test_reserve_in_use_withholds_used_and_reserved(recorded: Install) -> None:
    """A pool sized in memory with ``reserve_in_use`` shares what the driver counts as free.

    linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt, load: total 81559, used 19818,
    reserved 479 MiB. Before: the capacity was 81559 - 19818 = 61741 MiB, 479 MiB that the
    driver keeps counted as shareable.
    """
    recorded(H100, "load")
    pool = GPUPool(memory=True, reserve_in_use=True)
    assert pool.gpu_memory == (81559 - 19818 - 479,)


def test_a_gpu_with_only_reserved_memory_left_is_refused(recorded: Install) -> None:
    """The idle H100 has 0 MiB used, 479 reserved: 81080 MiB are shareable, not 81559."""
    recorded(H100, "idle")
    pool = GPUPool(memory=True, reserve_in_use=True)
    assert pool.gpu_memory == (81080,)


# nvidia-smi -L in each MIG capture (the instances' memory is s36-mig's part: not asserted).
MIG_LISTS = [
    # linux-x86_64__nvidia-h100-mig__590.48.01.txt:
    #   MIG 3g.40gb Device 0 ... MIG 1g.10gb Device 3 (UUID: MIG-00000003-...)
    (H100_MIG, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
    # linux-x86_64__nvidia-h200-mig__590.48.01.txt: two compute instances of one 3g.71gb
    (H200_MIG, ["1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]),
]


@pytest.mark.parametrize(("capture", "profiles"), MIG_LISTS)
def test_mig_devices_as_listed(recorded: Install, capture: str, profiles: list[str]) -> None:
    """Every MIG device ``nvidia-smi -L`` lists is detected, with its UUID, under its GPU."""
    recorded(capture, "idle")
    found = detect_gpus()
    assert found.source == GPUSource.NVIDIA_SMI and found.failed == ()
    assert [g.uuid for g in found.gpus] == [
        f"MIG-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(len(profiles))
    ]
    assert all(g.parent == GPU0 and g.is_mig for g in found.gpus)
    assert [g.name for g in found.gpus] == [
        f"{Capture(capture).value('idle', 'name')} MIG {p}" for p in profiles
    ]


def test_hwpool_asks_only_what_nvidia_smi_answers(recorded: Install, tmp_path: Path) -> None:
    """Every query detection makes is one the recorded nvidia-smi accepts (no exit 2)."""
    recorded(H100_MIG, "load")
    found = detect_gpus()
    assert found.nvidia_smi == "nvidia-smi listed 1 GPU, 4 MIG instances on 1 of them"
    args = (tmp_path / "args").read_text().splitlines()
    assert args[0].startswith("--query-gpu=index,uuid,name,memory.total,memory.used,")
    assert args[1:] == ["-L", ""]  # "": the default table, for the MIG devices' memory
