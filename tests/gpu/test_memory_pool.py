"""GPUPool sized in memory: GPUs of different sizes, requests in MiB, MIG instances."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes.gpus import A100, H100_MIG, RTX, smi_script
from hostserver import MakePool, MakeSizedPool
from hwpool import GPUInfo, GPUPool, WouldBlock
from hwpool._backends._local import LocalBackend
from hwpool._core._capacity import UNITS_PER_GPU, fraction_to_units
from hwpool._core._scheduler import Demand, Grant

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


def test_memory_requests_best_fit_by_least_memory_left(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)
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


def test_an_odd_sized_gpu_is_not_named_twice_in_the_error() -> None:
    # Before: "more than the largest GPU of this pool (81559MiB, 81559 MiB)".
    pool = GPUPool(gpu_memory=[81559, "24GiB"])
    with pytest.raises(ValueError, match=r"the largest GPU of this pool \(81559 MiB\): it could"):
        pool.acquire_nowait(memory="80GiB")


def test_a_request_larger_than_every_gpu_fails_at_once(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)
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
        ({"fraction": 0.0}, ValueError, r"fraction must be in \(0, 1\]"),
        ({"fraction": 1.5}, ValueError, r"fraction must be in \(0, 1\]"),
    ],
)
def test_bad_requests_change_nothing(
    kwargs: dict[str, object], error: type, match: str, sized_pool: MakeSizedPool
) -> None:
    pool = sized_pool(MIXED)
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


def test_a_fraction_on_gpus_of_one_size_is_that_share(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(["80GiB", "80GiB"])
    gpu = pool.acquire_nowait(0.5)
    assert pool.snapshot().free_mib[gpu] == 40 * GIB
    assert pool.acquire_nowait(0.3) == gpu  # best fit: the GPU with less left
    assert pool.snapshot().free_mib[gpu] == 40 * GIB - math.ceil(0.3 * 80 * GIB)
    pool.release(gpu, 0.5)
    pool.release(gpu, memory=math.ceil(0.3 * 80 * GIB))  # the same grant, named in MiB
    assert pool.snapshot().free_mib == (80 * GIB, 80 * GIB)


def test_whole_gpus_of_one_size(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(["24GiB", "24GiB"])
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


def test_whole_gpus_of_different_sizes_need_completely_free_gpus(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)
    assert pool.acquire_nowait() == 1  # one whole GPU: the smallest completely free one
    assert pool.acquire_nowait(1.0) == 0
    assert pool.snapshot().free_mib == (0, 0)
    pool.release(1)
    pool.release(0, 1.0)
    assert pool.acquire_full_nowait(2) == [0, 1]
    snap = pool.snapshot()
    assert snap.free_mib == (0, 0) and snap.free == (0.0, 0.0) and snap.granted == 3
    with pytest.raises(ValueError, match="hold no grant of 12288 MiB on GPU 1"):
        pool.release(1, memory="12GiB")
    pool.release(1, memory="24GiB")  # each part of a whole grant is its GPU's total
    assert pool.snapshot().free_mib == (0, 24 * GIB)
    assert pool.acquire_nowait(memory="6GiB") == 1
    with pytest.raises(WouldBlock, match="no GPU can take 2 whole GPU"):
        pool.acquire_full_nowait(2)
    pool.release(0)
    with pytest.raises(ValueError, match="hold no grant of 81920 MiB on GPU 0"):
        pool.release(0)  # released already
    assert pool.acquire_full_nowait(1) == [0]  # the 24 GiB card is not completely free
    with pytest.raises(WouldBlock, match="no GPU can take 1 whole GPU"):
        pool.acquire_full_nowait(1)
    pool.release(1, memory="6GiB")
    pool.release(0)
    snap = pool.snapshot()
    assert snap.free_mib == (80 * GIB, 24 * GIB) and snap.granted == snap.released == 5


def test_whole_gpus_of_different_sizes_bad_counts_change_nothing(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)
    with pytest.raises(ValueError, match="count must be between 1 and num_gpus=2"):
        pool.acquire_full_nowait(3)
    with pytest.raises(ValueError, match="count must be between 1 and num_gpus=2"):
        pool.lease_full(0)
    with pytest.raises(TypeError, match="count must be an int"):
        pool.acquire_full_nowait(1.0)  # type: ignore[arg-type]
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_whole_gpu_waiter_on_different_sizes_reserves_both(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)

    async def main() -> None:
        assert await pool.acquire(memory="1GiB") == 1
        both = asyncio.create_task(pool.acquire_full(2))
        await asyncio.sleep(0)
        (entry,) = pool.snapshot().waiting
        assert entry.count == 2 and entry.fraction == 1.0 and entry.reserved == (0, 1)
        with pytest.raises(WouldBlock):  # the 80 GiB card is free but reserved
            pool.acquire_nowait(memory="1GiB")
        pool.release(1, memory="1GiB")
        assert await asyncio.wait_for(both, 5) == [0, 1]
        pool.release(0)
        pool.release(1)

    asyncio.run(main())
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_whole_gpu_waiters_on_different_sizes_are_granted_cancelled_and_time_out(
    sized_pool: MakeSizedPool,
) -> None:
    pool = sized_pool(MIXED)

    async def main() -> None:
        first = await pool.acquire(memory="1GiB")
        assert first == 1
        both = asyncio.create_task(pool.acquire_full(2))
        lease = pool.lease_full(2)
        leased = asyncio.create_task(lease.__aenter__())
        await asyncio.sleep(0)
        assert [w.count for w in pool.snapshot().waiting] == [2, 2]
        with pytest.raises(TimeoutError):
            await pool.acquire_full(1, timeout=0.01)  # the 80 GiB card is reserved
        pool.release(1, memory="1GiB")
        assert await asyncio.wait_for(both, 5) == [0, 1]
        assert pool.snapshot().free_mib == (0, 0)
        leased.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leased
        pool.release(0)
        pool.release(1)
        async with pool.lease_full(2) as gpus:
            assert gpus == [0, 1] and pool.snapshot().free_mib == (0, 0)

    asyncio.run(main())
    snap = pool.snapshot()
    assert snap.free_mib == (80 * GIB, 24 * GIB) and snap.waiting == ()
    assert (snap.cancelled, snap.timed_out) == (1, 1)


def test_whole_gpus_of_different_sizes_blocking(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)
    pool.acquire_nowait(memory="70GiB")
    got: list[list[int]] = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire_full_blocking(2)))
    thread.start()
    while not pool.snapshot().waiting:  # bounded by the test timeout; no sleep stands in
        thread.join(0.01)
    with pytest.raises(TimeoutError):
        pool.acquire_full_blocking(1, timeout=0.01)  # both GPUs reserved by the waiter
    pool.release(0, memory="70GiB")
    thread.join(10)
    assert got == [[0, 1]]
    pool.release(0)
    pool.release(1)
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_whole_lease_on_different_sizes(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)
    lease = pool.lease_full(2)
    with lease as gpus:
        assert gpus == [0, 1] and lease.fraction == 1.0 and lease.memory_mib == 104 * GIB
        assert pool.snapshot().free_mib == (0, 0)
    one = pool.lease()
    with one as gpus:
        assert gpus == [1] and one.fraction == 1.0 and one.memory_mib == 24 * GIB
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


@given(
    sizes=st.lists(st.integers(1, 200_000), min_size=2, max_size=4),
    steps=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 200_000)), max_size=40),
)
@settings(max_examples=60)
def test_whole_and_memory_grants_on_random_sizes_conserve_memory(
    sizes: list[int], steps: list[tuple[int, int]]
) -> None:
    pool = GPUPool(gpu_memory=sizes)
    held: list[tuple[int, int | None]] = []  # (gpu, MiB) or (gpu, None): a whole GPU
    for kind, amount in steps:
        if kind == 2 and held:
            gpu, size = held.pop(amount % len(held))
            pool.release(gpu) if size is None else pool.release(gpu, memory=size)
        elif kind == 1:
            count = 1 + amount % len(sizes)
            idle = [g for g, f in enumerate(pool.snapshot().free_mib or ()) if f == sizes[g]]
            try:
                gpus = pool.acquire_full_nowait(count)
            except WouldBlock:
                assert len(idle) < count
                continue
            assert set(gpus) <= set(idle) and len(gpus) == count
            held += [(g, None) for g in gpus]
        elif amount <= max(sizes):
            try:
                held.append((pool.acquire_nowait(memory=amount), amount))
            except WouldBlock:
                assert all(f < amount for f in pool.snapshot().free_mib or ())
        used = [
            sum(sizes[g] if a is None else a for g, a in held if g == gpu)
            for gpu in range(len(sizes))
        ]
        assert pool.snapshot().free_mib == tuple(s - u for s, u in zip(sizes, used, strict=True))


def test_leases_in_memory(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)

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


def test_a_waiter_for_memory_is_granted_when_enough_is_released(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(MIXED)

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


def test_a_blocking_waiter_for_memory(sized_pool: MakeSizedPool) -> None:
    pool = sized_pool(["24GiB"])
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


def test_the_backend_releases_a_whole_grant_of_different_sizes_by_parts() -> None:
    backend = LocalBackend((GPUInfo(0, "0"), GPUInfo(1, "1")), totals=(80 * GIB, 24 * GIB))
    grant = backend.acquire_now(Demand(2, 80 * GIB, whole=True))
    assert grant is not None and grant.gpus == (0, 1) and grant.units == 0
    with pytest.raises(ValueError, match="is not held under grant"):
        backend.release(Grant(grant.ticket, (1,), 12 * GIB))  # not what GPU 1 holds
    assert backend.snapshot().free_mib == (0, 0)
    backend.release(Grant(grant.ticket, (1,), 24 * GIB))
    assert backend.snapshot().free_mib == (0, 24 * GIB)
    backend.release(Grant(grant.ticket, (0,), 0))  # the rest, as the grant names it
    assert backend.snapshot().free_mib == (80 * GIB, 24 * GIB)
    again = backend.acquire_now(Demand(2, 80 * GIB, whole=True))
    assert again is not None
    backend.release(again)
    with pytest.raises(ValueError, match=r"\(whole GPU\(s\) \[0, 1\]\) is not held"):
        backend.release(again)
    snap = backend.snapshot()
    assert snap.free_mib == (80 * GIB, 24 * GIB) and snap.released == snap.granted == 2


# ------------------------------------------------- fractions on GPUs of different sizes
@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_a_fraction_on_different_sizes_is_that_share_of_the_gpu_it_lands_on(policy: str) -> None:
    pool = GPUPool(gpu_memory=MIXED, policy=policy)
    # Best fit, the least left after the grant: 12 GiB left on the 24 GiB GPU, not 40 GiB.
    assert pool.acquire_nowait(0.5) == 1
    assert pool.snapshot().free_mib == (80 * GIB, 12 * GIB)
    assert pool.acquire_nowait(0.5) == 1
    assert pool.acquire_nowait(0.5) == 0  # 40 GiB of the 80 GiB GPU
    assert pool.snapshot().free_mib == (40 * GIB, 0)
    with pytest.raises(WouldBlock, match=r"fraction=0\.75 of a GPU of any size"):
        pool.acquire_nowait(0.75)  # 60 GiB on GPU 0, 18 on GPU 1: neither has it
    pool.release(0, 0.5)  # half of the 80 GiB GPU
    assert pool.snapshot().free_mib == (80 * GIB, 0)
    pool.release(1, 0.5)  # half of the 24 GiB GPU
    assert pool.snapshot().free_mib == (80 * GIB, 12 * GIB)
    with pytest.raises(ValueError, match="no grant of 40960 MiB on GPU 0"):
        pool.release(0, 0.5)
    pool.release(1, memory="12GiB")  # the same grant, named in MiB
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_fractional_lease_on_different_sizes_holds_its_gpus_share(
    sized_pool: MakeSizedPool,
) -> None:
    pool = sized_pool(MIXED)
    lease = pool.lease(0.5)
    assert lease.fraction == 0.5 and lease.memory_mib is None  # depends on the GPU
    with lease as gpus:
        assert gpus == [1] and lease.memory_mib == 12 * GIB and lease.fraction == 0.5
        assert pool.snapshot().free_mib == (80 * GIB, 12 * GIB)
        with pool.lease(0.5) as more:  # the other half of the small GPU
            assert more == [1]
            with pool.lease(0.5) as big:
                assert big == [0] and pool.snapshot().free_mib == (40 * GIB, 0)
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)
    pool.acquire_nowait(memory="20GiB")  # GPU 1 keeps 4 GiB: half of it no longer fits

    async def main() -> None:
        lease = pool.lease(0.3)
        async with lease as gpus:
            assert gpus == [0] and lease.memory_mib == math.ceil(0.3 * 80 * GIB)

    asyncio.run(main())
    pool.release(1, memory="20GiB")
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_fractional_waiter_on_different_sizes_takes_the_share_of_the_gpu_that_frees(
    sized_pool: MakeSizedPool,
) -> None:
    pool = sized_pool(MIXED)

    async def main() -> None:
        assert await pool.acquire(memory="70GiB") == 0
        assert await pool.acquire(memory="20GiB") == 1
        waiter = asyncio.create_task(pool.acquire(0.5, timeout=5))
        await asyncio.sleep(0)  # a yield to the loop: the waiter queues
        (entry,) = pool.snapshot().waiting
        assert entry.fraction == 0.5 and entry.memory_mib is None and entry.count == 1
        pool.release(1, memory="20GiB")  # 24 GiB free there: half of it fits
        assert await asyncio.wait_for(waiter, 5) == 1
        assert pool.snapshot().free_mib == (10 * GIB, 12 * GIB)
        pool.release(1, 0.5)
        pool.release(0, memory="70GiB")

    asyncio.run(main())
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


def test_a_blocking_fractional_waiter_on_different_sizes() -> None:
    pool = GPUPool(gpu_memory=MIXED, policy="reserve-all")
    pool.acquire_nowait(memory="50GiB")  # GPU 0: 30 GiB left, half of it (40) does not fit
    pool.acquire_nowait(memory="20GiB")  # GPU 1: 4 GiB left, half of it (12) does not fit
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire_blocking(0.5, timeout=10)))
    thread.start()
    while not pool.snapshot().waiting:  # bounded by the test timeout; no sleep stands in
        thread.join(0.01)
    pool.release(0, memory="50GiB")
    thread.join(10)
    assert got == [0] and pool.snapshot().free_mib == (40 * GIB, 4 * GIB)
    pool.release(0, 0.5)
    pool.release(1, memory="20GiB")
    assert pool.snapshot().free_mib == (80 * GIB, 24 * GIB)


@given(
    sizes=st.lists(st.integers(1, 200_000), min_size=2, max_size=4),
    steps=st.lists(
        st.tuples(st.booleans(), st.fractions(0, 1).filter(lambda f: f > 0), st.integers(0, 99)),
        max_size=40,
    ),
)
@settings(max_examples=60)
def test_fractions_on_random_sizes_conserve_memory(
    sizes: list[int], steps: list[tuple[bool, object, int]]
) -> None:
    pool = GPUPool(gpu_memory=sizes)
    held: list[tuple[int, object]] = []
    for take, fraction, pick in steps:
        if not take and held:
            gpu, share = held.pop(pick % len(held))
            pool.release(gpu, share)  # type: ignore[arg-type]
        elif take:
            units = fraction_to_units(fraction)
            needs = [max(1, -(-units * size // UNITS_PER_GPU)) for size in sizes]
            free = pool.snapshot().free_mib or ()
            try:
                gpu = pool.acquire_nowait(fraction)  # type: ignore[arg-type]
            except WouldBlock:
                assert all(f < n for f, n in zip(free, needs, strict=True))
                continue
            if units < UNITS_PER_GPU:
                fitting = [g for g in range(len(sizes)) if free[g] >= needs[g]]
                assert gpu == min(fitting, key=lambda g: (free[g] - needs[g], g))
            held.append((gpu, fraction))
        used = [0] * len(sizes)
        for gpu, share in held:
            units = fraction_to_units(share)
            used[gpu] += max(1, -(-units * sizes[gpu] // UNITS_PER_GPU))
        assert pool.snapshot().free_mib == tuple(s - u for s, u in zip(sizes, used, strict=True))
