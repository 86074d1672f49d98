"""GPUPool sized in memory: GPUs of different sizes, requests in MiB, MIG instances."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.gpus import A100, H100_MIG, RTX, smi_script
from hostserver import MakePool
from hwpool import GPUInfo, GPUPool, WouldBlock
from hwpool._backends._local import LocalBackend

GIB = 1024
MIXED = ["80GiB", "24GiB"]


def test_logical_gpus_of_given_sizes() -> None:
    pool = GPUPool(gpu_memory=["80GiB", 24 * GIB, "1.5G"])
    assert pool.gpu_memory == (80 * GIB, 24 * GIB, 1536)
    assert [g.memory_mib for g in pool.gpus] == [80 * GIB, 24 * GIB, 1536]
    assert pool.num_gpus == 3 and GPUPool(2).gpu_memory is None
    assert repr(pool) == "GPUPool(gpu_memory=['81920MiB', '24576MiB', '1536MiB'])"
    snap = pool.snapshot()
    assert snap.free == (1.0, 1.0, 1.0) and snap.free_mib == snap.total_mib == pool.gpu_memory


def test_memory_requests_best_fit_by_least_memory_left() -> None:
    pool = GPUPool(gpu_memory=MIXED)
    assert pool.acquire_nowait(memory="6GiB") == 1  # 18 GiB left there, against 74
    assert pool.acquire_nowait(memory="40GiB") == 0  # fits the large card only
    assert pool.acquire_nowait(memory="18GiB") == 1  # exactly what is left
    assert pool.acquire_nowait(memory=20 * GIB) == 0
    with pytest.raises(WouldBlock, match="no GPU can take 21504 MiB"):
        pool.acquire_nowait(memory="21GiB")
    assert pool.snapshot().free_mib == (20 * GIB, 0)
    pool.release(1, memory="18GiB")
    pool.release(1, memory=6 * GIB)
    pool.release(0, memory="40GiB")
    pool.release(0, memory="20G")
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_request_larger_than_every_gpu_fails_at_once() -> None:
    pool = GPUPool(gpu_memory=MIXED)
    with pytest.raises(
        ValueError,
        match=r"memory='81GiB' \(82944 MiB\) is more than the largest GPU of this pool "
        r"\(80GiB, 81920 MiB\)",
    ):
        pool.acquire_blocking(memory="81GiB", timeout=None)
    assert pool.snapshot().waiting == ()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fraction": 0.5, "memory": "6GiB"}, TypeError, "give fraction or memory, not both"),
        ({"memory": "6 gigs"}, ValueError, "memory must be an int of MiB"),
        ({"memory": 0}, ValueError, "memory must be between 1 and"),
        ({"memory": 1.5}, TypeError, "memory must be an int of MiB"),
        ({"memory": True}, TypeError, "memory must be an int of MiB"),
        (
            {"fraction": 0.5},
            ValueError,
            r"fraction=0.5 on GPUs of different sizes \(80GiB, 24GiB\)",
        ),
        ({"fraction": 1.5}, ValueError, r"fraction must be in \(0, 1\]"),
    ],
)
def test_bad_requests_change_nothing(kwargs: dict[str, object], error: type, match: str) -> None:
    pool = GPUPool(gpu_memory=MIXED)
    with pytest.raises(error, match=match):
        pool.acquire_nowait(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        pool.lease(**kwargs)  # type: ignore[arg-type]
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_memory_on_a_fraction_pool_is_a_clear_error(make_pool: MakePool) -> None:
    pool = make_pool(2)  # the in-process pool and the host server's: both share fractions
    with pytest.raises(ValueError, match=r"memory='6GiB': this pool shares fractions of a GPU"):
        pool.acquire_nowait(memory="6GiB")
    with pytest.raises(ValueError, match="this pool shares fractions"):
        pool.release(0, memory="6GiB")
    assert pool.snapshot().free == (1.0, 1.0)


def test_a_fraction_on_gpus_of_one_size_is_that_share() -> None:
    pool = GPUPool(gpu_memory=["80GiB", "80GiB"])
    gpu = pool.acquire_nowait(0.5)
    assert pool.snapshot().free_mib[gpu] == 40 * GIB
    assert pool.acquire_nowait(0.3) == gpu  # best fit: the GPU with less left
    assert pool.snapshot().free_mib[gpu] == 40 * GIB - math.ceil(0.3 * 80 * GIB)
    pool.release(gpu, 0.5)
    pool.release(gpu, memory=math.ceil(0.3 * 80 * GIB))  # the same grant, named in MiB
    assert pool.snapshot().free_mib == (80 * GIB, 80 * GIB)


def test_whole_gpus_of_one_size() -> None:
    pool = GPUPool(gpu_memory=["24GiB", "24GiB"])
    assert pool.acquire_nowait() == 0  # fraction 1 (or nothing): one whole GPU
    assert pool.acquire_nowait(1.0) == 1
    pool.release(0)
    pool.release(1, 1.0)
    assert pool.acquire_full_nowait(2) == [0, 1]
    assert pool.snapshot().free_mib == (0, 0)
    with pytest.raises(ValueError, match="hold no grant of 12288 MiB on GPU 0"):
        pool.release(0, memory="12GiB")
    pool.release(0)
    pool.release(1, memory="24GiB")
    assert pool.snapshot().free_mib == (24 * GIB, 24 * GIB)


def test_whole_gpus_of_different_sizes_are_refused_for_now() -> None:
    pool = GPUPool(gpu_memory=MIXED)
    for call in (pool.acquire_nowait, lambda: pool.acquire_full_nowait(1), pool.lease):
        with pytest.raises(
            ValueError, match=r"whole GPUs on GPUs of different sizes \(80GiB, 24GiB\)"
        ):
            call()
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_leases_in_memory() -> None:
    pool = GPUPool(gpu_memory=MIXED)

    async def main() -> None:
        async with pool.lease(memory="12GiB") as gpus:
            assert gpus == [1]
            assert pool.snapshot().free_mib == (80 * GIB, 12 * GIB)

    asyncio.run(main())
    lease = pool.lease(memory="12GiB")
    assert lease.memory_mib == 12 * GIB and lease.fraction == 12 / 80
    with lease as gpus:
        assert gpus == [1] and lease.fraction == 0.5
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_waiter_for_memory_is_granted_when_enough_is_released() -> None:
    pool = GPUPool(gpu_memory=MIXED)

    async def main() -> None:
        big = await pool.acquire(memory="70GiB")
        small = await pool.acquire(memory="20GiB")
        assert (big, small) == (0, 1)
        waiter = asyncio.create_task(pool.acquire(memory="16GiB"))
        await asyncio.sleep(0)
        (entry,) = pool.snapshot().waiting
        assert entry.memory_mib == 16 * GIB and entry.count == 1
        pool.release(small, memory="20GiB")
        assert await asyncio.wait_for(waiter, 5) == 1
        pool.release(1, memory="16GiB")
        pool.release(0, memory="70GiB")

    asyncio.run(main())
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_blocking_waiter_for_memory() -> None:
    pool = GPUPool(gpu_memory=["24GiB"])
    pool.acquire_nowait(memory="20GiB")
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire_blocking(memory="8GiB")))
    thread.start()
    while not pool.snapshot().waiting:  # bounded by the test timeout; no sleep stands in
        thread.join(0.01)
    pool.release(0, memory="20GiB")
    thread.join(10)
    assert got == [0] and pool.snapshot().free_mib == (16 * GIB,)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"gpu_memory": []}, ValueError, "gpu_memory must name at least one GPU"),
        ({"gpu_memory": "80GiB"}, TypeError, "gpu_memory must be a list of amounts"),
        ({"gpu_memory": ["80GiB", 0]}, ValueError, r"gpu_memory\[1\] must be between 1 and"),
        ({"gpu_memory": ["80GiB", "6 gigs"]}, ValueError, r"gpu_memory\[1\] must be an int"),
        ({"gpu_memory": [True]}, TypeError, r"gpu_memory\[0\] must be an int of MiB"),
        ({"memory": "yes"}, TypeError, "memory must be a bool"),
        ({"memory": True, "gpu_memory": MIXED}, TypeError, "not both"),
        ({"memory": True, "num_gpus": 2}, TypeError, "give num_gpus or memory=True, not both"),
        ({"gpu_memory": MIXED, "num_gpus": 2}, TypeError, "give num_gpus or gpu_memory"),
        (
            {"gpu_memory": MIXED, "backend": LocalBackend((GPUInfo(0, "0"),))},
            TypeError,
            "give backend or a memory size",
        ),
    ],
)
def test_bad_pool_sizes(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        GPUPool(**kwargs)  # type: ignore[arg-type]


def test_memory_true_sizes_by_detection(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([A100, RTX]))
    pool = GPUPool(memory=True)
    assert pool.gpu_memory == (81920, 24564)
    assert pool.gpus[1].uuid == RTX.uuid
    assert pool.acquire_nowait(memory="24000MiB") == 1


def test_memory_true_without_known_memory_says_what_to_do(fake_smi) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"memory=True needs every GPU's memory.*gpu_memory="):
        GPUPool(memory=True)


def test_memory_true_matches_cuda_visible_devices(
    fake_smi, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    fake_smi(smi_script([A100, RTX]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", RTX.uuid)
    pool = GPUPool(memory=True)
    assert pool.gpu_memory == (24564,) and pool.gpus[0].device_id == RTX.uuid


def test_mig_instances_are_gpus_of_their_own_size(fake_nvml) -> None:  # type: ignore[no-untyped-def]
    fake_nvml([H100_MIG])
    pool = GPUPool(memory=True)
    assert pool.gpu_memory == (40448, 20096, 9856)
    assert pool.acquire_nowait(memory="9GiB") == 2
    assert pool.acquire_nowait(memory=20096) == 1  # all of one instance
    with pytest.raises(ValueError, match="MIG instances, and a CUDA process can use only one"):
        pool.acquire_full_nowait(2)
    with pytest.raises(ValueError, match="count=2: this pool's GPUs include MIG instances"):
        pool.lease_full(2)
    fraction_pool = GPUPool()  # the default pool refuses it the same way
    with pytest.raises(ValueError, match="MIG instances"):
        fraction_pool.acquire_full_nowait(2)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 200_000), min_size=1, max_size=5),
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 200_000)), max_size=40),
)
def test_held_plus_free_is_each_gpus_memory(
    sizes: list[int], steps: list[tuple[bool, int]]
) -> None:
    pool = GPUPool(gpu_memory=sizes)
    held: list[tuple[int, int]] = []
    for take, amount in steps:
        if take or not held:
            if amount > max(sizes):
                with pytest.raises(ValueError, match="more than the largest GPU"):
                    pool.acquire_nowait(memory=amount)
                continue
            try:
                gpu = pool.acquire_nowait(memory=amount)
            except WouldBlock:
                assert all(f < amount for f in pool.snapshot().free_mib or ())
                continue
            held.append((gpu, amount))
        else:
            gpu, size = held.pop(amount % len(held))
            pool.release(gpu, memory=size)
        used = [sum(a for g, a in held if g == gpu) for gpu in range(len(sizes))]
        snap = pool.snapshot()
        assert snap.free_mib == tuple(s - u for s, u in zip(sizes, used, strict=True))
