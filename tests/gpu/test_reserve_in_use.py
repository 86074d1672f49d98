"""GPUPool(memory=True, reserve_in_use=True): memory held outside hwpool when the pool is made
is left alone. Fake nvidia-smi and NVML machines (tests/fakes/gpus.py) say what is in use."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from fakes.gpus import A100, H100_MIG, RTX, smi_script
from hwpool import GPUInfo, GPUPool, WouldBlock, gpu_memory_in_use
from hwpool._backends._local import LocalBackend

DESKTOP = replace(RTX, used_mib=1536)  # a desktop session holds 1.5 GiB of the 24 GiB card
BUSY = replace(A100, used_mib=20480)  # another job holds 20 GiB of the 80 GiB one
MIGS = [
    None if m is None else replace(m, used_mib=used)
    for m, used in zip(H100_MIG.migs or [], [4096, 0, 0, 512], strict=True)
]
H100_BUSY = replace(H100_MIG, migs=MIGS)


def test_capacity_is_the_total_less_the_memory_in_use(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([BUSY, DESKTOP]))
    pool = GPUPool(memory=True, reserve_in_use=True)
    assert pool.gpu_memory == (81920 - 20480, 24564 - 1536)
    # pool.gpus keeps what detection found: the totals and the use.
    assert [(g.memory_mib, g.memory_used_mib) for g in pool.gpus] == [(81920, 20480), (24564, 1536)]
    assert repr(pool) == (
        "GPUPool(gpu_memory=['61440MiB', '23028MiB'], in_use_at_start=['20480MiB', '1536MiB'])"
    )
    snap = pool.snapshot()
    assert snap.total_mib == snap.free_mib == pool.gpu_memory
    assert pool.acquire_nowait(memory=23028) == 1  # all that is left on the small card
    assert pool.acquire_nowait(memory=61440) == 0  # and on the large one
    with pytest.raises(WouldBlock):
        pool.acquire_nowait(memory=1)  # the 22,016 MiB in use elsewhere are not handed out


def test_without_reserve_in_use_the_use_is_only_reported(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([BUSY, DESKTOP]))
    pool = GPUPool(memory=True)
    assert pool.gpu_memory == (81920, 24564)
    assert pool.gpus[0].memory_used_mib == 20480
    assert repr(pool) == "GPUPool(gpu_memory=['81920MiB', '24564MiB'])"


def test_mig_instances_through_nvml(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    fake_nvml([H100_BUSY, DESKTOP])
    pool = GPUPool(memory=True, reserve_in_use=True)
    assert pool.gpu_memory == (40448 - 4096, 20096, 9856 - 512, 24564 - 1536)
    assert [g.memory_used_mib for g in pool.gpus] == [4096, 0, 512, 1536]


def test_a_request_larger_than_what_is_left_everywhere_fails_at_once(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([DESKTOP, replace(DESKTOP, uuid="GPU-second")]))
    pool = GPUPool(memory=True, reserve_in_use=True)
    # 23 GiB fits each card's total (24,564 MiB) but not what is left on either (23,028).
    message = re.escape("memory='23GiB' (23552 MiB) is more than the largest GPU of this pool")
    with pytest.raises(ValueError, match=message + ".*could never be granted"):
        pool.acquire_blocking(memory="23GiB", timeout=None)  # would wait forever if admitted
    with pytest.raises(ValueError, match=message):
        pool.acquire_nowait(memory="23GiB")
    assert pool.snapshot().waiting == () and pool.snapshot().free_mib == (23028, 23028)
    assert GPUPool(memory=True).acquire_nowait(memory="23GiB") == 0  # the full pool takes it


def test_the_reading_is_taken_once(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([DESKTOP]))
    pool = GPUPool(memory=True, reserve_in_use=True)
    pool.acquire_nowait(memory="20GiB")
    # The pool's own work (or anyone else) now uses more: the pool is not resized by it.
    fake_smi(smi_script([replace(DESKTOP, used_mib=1536 + 20480)]))
    assert gpu_memory_in_use(pool.gpus) == (22016,)  # what `hwpool status` will show
    assert pool.gpu_memory == (23028,)
    assert pool.acquire_nowait(memory=23028 - 20480) == 0
    assert pool.snapshot().free_mib == (0,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reserve_in_use": True}, "reserve_in_use=True needs memory=True"),
        ({"reserve_in_use": True, "num_gpus": 2}, "reserve_in_use=True needs memory=True"),
        (
            {"reserve_in_use": True, "gpu_memory": ["24GiB"]},
            re.escape(
                "reserve_in_use=True reads the memory in use on detected GPUs; logical "
                "GPUs (gpu_memory=['24GiB']) have none"
            ),
        ),
        (
            {"reserve_in_use": True, "memory": True, "gpu_memory": ["24GiB"]},
            "give memory=True or gpu_memory",
        ),
        (
            {"reserve_in_use": True, "memory": True, "num_gpus": 2},
            "give num_gpus or memory=True, not both",
        ),
        (
            {"reserve_in_use": True, "backend": LocalBackend((GPUInfo(0, "0"),))},
            "reserve_in_use=True needs memory=True",
        ),
        ({"memory": True, "reserve_in_use": 1}, r"reserve_in_use must be a bool, got 1 \(int\)"),
        ({"memory": True, "reserve_in_use": "yes"}, "reserve_in_use must be a bool"),
    ],
)
def test_bad_combinations_are_type_errors(fake_smi, kwargs: dict[str, object], match: str) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([DESKTOP]))
    with pytest.raises(TypeError, match=match):
        GPUPool(**kwargs)  # type: ignore[arg-type]


def test_an_unknown_use_is_refused_not_guessed(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([DESKTOP, RTX]))  # RTX: nvidia-smi prints [N/A]
    with pytest.raises(
        ValueError,
        match=re.escape("reserve_in_use=True needs every GPU's memory in use, but detection "
                        "(nvidia-smi) could not read it for GPU(s) [1]; install the nvml extra"),
    ):  # fmt: skip
        GPUPool(memory=True, reserve_in_use=True)
    assert GPUPool(memory=True).gpu_memory == (24564, 24564)  # without it: the totals


def test_mig_instances_through_nvidia_smi_have_their_tables_use(fake_smi) -> None:  # type: ignore[no-untyped-def]
    """nvidia-smi's default table gives each MIG device's use ("MIG devices" section)."""
    fake_smi(smi_script([H100_BUSY]))
    assert GPUPool(memory=True, reserve_in_use=True).gpu_memory == (36352, 20096, 9344)


def test_mig_instances_without_nvidia_smis_table_have_no_known_size(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(f"[ $# -eq 0 ] && exit 9\n{smi_script([H100_BUSY])}")
    with pytest.raises(ValueError, match=r"memory=True needs every GPU's memory, but detection"):
        GPUPool(memory=True, reserve_in_use=True)


@pytest.mark.parametrize("used", [24564, 30000])
def test_a_gpu_with_nothing_left_is_refused(fake_smi, used: int) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([BUSY, replace(RTX, used_mib=used)]))
    with pytest.raises(
        ValueError,
        match=re.escape(f"reserve_in_use=True: GPU 1 (device 1) has {used} MiB in use of its "
                        "24564 MiB, so nothing is left to share; hide it with "
                        "CUDA_VISIBLE_DEVICES"),
    ):  # fmt: skip
        GPUPool(memory=True, reserve_in_use=True)


def test_one_mib_left_is_a_gpu_of_one_mib(fake_smi, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([BUSY, replace(RTX, used_mib=24563)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", RTX.uuid)  # and only that card is visible
    pool = GPUPool(memory=True, reserve_in_use=True)
    assert pool.gpu_memory == (1,) and pool.gpus[0].device_id == RTX.uuid
