"""An in-process pool on MIG devices that share a GPU instance's memory (issue 36).

From the H200 MIG capture (``tests/fakes/captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt``,
answered by a fake nvidia-smi): MIG devices 0 and 1 are compute instances of GPU instance 2,
71424 MiB that both report and both draw on (NVIDIA's MIG User Guide, "MIG Device Names":
compute instances of one GPU instance share its memory). Whatever is leased on them together
stays within 71424 MiB; each remains a device of its own.
"""

from __future__ import annotations

import pytest

from fakes.mig_captures import H200_MIG, capture_smi
from hwpool import GPUPool, WouldBlock


@pytest.fixture
def h200(fake_smi) -> None:  # type: ignore[no-untyped-def]
    fake_smi(capture_smi(H200_MIG, "load"))


@pytest.mark.usefixtures("h200")
@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_two_compute_instances_never_lease_more_than_their_gpu_instance(policy: str) -> None:
    """The defect: the pool granted 40 GiB on each of MIG devices 0 and 1, 80 GiB of 69.75."""
    with GPUPool(memory=True, policy=policy) as pool:
        assert pool.gpu_memory == (71424, 71424, 33280, 16384, 16384)
        first = pool.acquire_nowait(memory="40GiB")
        assert first == 0
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(memory="40GiB")  # GPU instance 2 has 30464 MiB left
        assert pool.snapshot().free_mib == (30464, 30464, 33280, 16384, 16384)
        second = pool.acquire_nowait(memory="29GiB")  # best fit: what is left of it
        assert second in (0, 1)
        pool.release(first, memory="40GiB")
        pool.release(second, memory="29GiB")
        assert pool.snapshot().free_mib == (71424, 71424, 33280, 16384, 16384)


@pytest.mark.usefixtures("h200")
def test_a_whole_lease_of_a_compute_instance_holds_its_whole_gpu_instance() -> None:
    """CUDA lets the process on a compute instance allocate all of its GPU instance's
    memory, so a whole lease of one leaves nothing on the other, which stays a device of
    its own (its memory group is named on both)."""
    with GPUPool(memory=True) as pool:
        assert pool.gpus[0].memory_group == pool.gpus[1].memory_group is not None
        assert [pool.acquire_nowait(memory="16GiB") for _ in range(2)] == [3, 4]
        assert pool.acquire_nowait(memory="32GiB") == 2
        assert pool.acquire_full_nowait(1) == [0]  # only GPU instance 2 is left whole
        assert pool.snapshot().free_mib == (0, 0, 512, 0, 0)
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(memory=600)  # device 1 draws on what device 0 holds
        pool.release(0)
        assert pool.acquire_nowait(memory="60GiB") == 0


@pytest.mark.usefixtures("h200")
def test_a_fraction_pool_shares_a_gpu_instance_too() -> None:
    with GPUPool() as pool:
        assert pool.num_gpus == 5
        assert pool.acquire_nowait(0.6) == 0
        gpu = pool.acquire_nowait(0.6)
        assert gpu not in (0, 1), "0.6 of GPU instance 2 is held through device 0"
