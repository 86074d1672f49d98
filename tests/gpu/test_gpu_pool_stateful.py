"""A hypothesis state machine drives a real GPUPool with asyncio tasks.

Random acquires (fractional and whole), releases, cancellations and zero timeouts; after every
step the pool must account for every unit, never over-grant, and never hand a grant to a
cancelled or timed-out waiter. Under ``reserve-all`` the head waiter reserves the most-free
GPUs; under ``easy`` (on a frozen clock, so that its choices do not depend on how fast this
machine runs) only the head reserves, and it keeps its GPUs while it is the head.
"""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hwpool import GPUPool
from hwpool._backends._local import LocalBackend
from hwpool._host._devices import GPUInfo

NUM_GPUS = 3
FRACTIONS = st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.6, 0.75, 1.0])


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.pool = GPUPool(NUM_GPUS, policy="reserve-all")
        self.pending: dict[asyncio.Task[list[int]], float] = {}  # task -> fraction per GPU
        self.held: list[tuple[int, float]] = []  # (gpu, fraction) granted and not released
        self.abandoned: list[asyncio.Task[list[int]]] = []

    def teardown(self) -> None:
        for task in self.pending:
            task.cancel()
        self.settle()
        self.loop.close()

    def settle(self) -> None:
        """Run the loop until every live task is done or parked in the pool's queue."""
        for _ in range(200):
            self.loop.run_until_complete(asyncio.sleep(0))
            self.collect()
            if len(self.pending) == self.pool.snapshot().waiting.__len__():
                return
        raise AssertionError("the pool never settled")

    def collect(self) -> None:
        for task in [t for t in self.pending if t.done()]:
            fraction = self.pending.pop(task)
            if task.cancelled() or task.exception() is not None:
                self.abandoned.append(task)
                continue
            self.held.extend((gpu, fraction) for gpu in task.result())

    def start(self, coro_fn: object, fraction: float) -> None:
        task = self.loop.create_task(coro_fn)  # type: ignore[arg-type]
        self.pending[task] = fraction
        self.settle()

    async def one(self, fraction: float, timeout: float | None) -> list[int]:
        return [await self.pool.acquire(fraction, timeout=timeout)]

    @rule(fraction=FRACTIONS, zero_timeout=st.booleans())
    def acquire(self, fraction: float, zero_timeout: bool) -> None:
        self.start(self.one(fraction, 0 if zero_timeout else None), fraction)

    @rule(count=st.integers(1, NUM_GPUS), zero_timeout=st.booleans())
    def acquire_full(self, count: int, zero_timeout: bool) -> None:
        coro = self.pool.acquire_full(count, timeout=0 if zero_timeout else None)
        self.start(coro, 1.0)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        gpu, fraction = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.pool.release(gpu, fraction)
        self.settle()

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), release_first=st.booleans())
    def cancel(self, data: st.DataObject, release_first: bool) -> None:
        task = data.draw(st.sampled_from(list(self.pending)))
        if release_first and self.held:  # a release whose grant may race with the cancel
            gpu, fraction = self.held.pop()
            self.pool.release(gpu, fraction)
        task.cancel()
        self.settle()

    @invariant()
    def every_unit_accounted_for(self) -> None:
        free = self.pool.snapshot().free
        for gpu in range(NUM_GPUS):
            granted = sum(f for g, f in self.held if g == gpu)
            assert -1e-9 <= free[gpu] <= 1.0 + 1e-9
            assert abs(free[gpu] + granted - 1.0) < 1e-9, (gpu, free, self.held)

    @invariant()
    def abandoned_tasks_got_nothing(self) -> None:
        for task in self.abandoned:
            assert task.cancelled() or isinstance(task.exception(), TimeoutError)

    @invariant()
    def head_reserves_the_most_free_gpus(self) -> None:
        snap = self.pool.snapshot()
        if not snap.waiting:
            return
        head = snap.waiting[0]
        order = sorted(range(NUM_GPUS), key=lambda g: (-snap.free[g], g))
        assert head.reserved == tuple(sorted(order[: head.count]))


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestPoolMachine = PoolMachine.TestCase


class EasyPoolMachine(PoolMachine):
    def __init__(self) -> None:
        super().__init__()
        self.backend = LocalBackend(self.pool.gpus, clock=lambda: 0.0)
        self.pool = GPUPool(backend=self.backend)
        self.head: tuple[int, tuple[int, ...]] | None = None  # (core ticket, its GPUs)

    @invariant()
    def head_reserves_the_most_free_gpus(self) -> None:
        """Replaced: only the head reserves, and it keeps what it reserved."""
        snap = self.pool.snapshot()
        assert all(not w.reserved for w in snap.waiting[1:])
        if not snap.waiting:
            self.head = None
            return
        head, core_head = snap.waiting[0], self.backend._core.head
        assert core_head is not None and core_head.gpus == head.reserved
        assert len(head.reserved) == head.count == len(set(head.reserved))
        if self.head is not None and self.head[0] == core_head.ticket:
            assert head.reserved == self.head[1], "the head's reservation hopped"
        self.head = (core_head.ticket, head.reserved)


EasyPoolMachine.TestCase.settings = PoolMachine.TestCase.settings
TestEasyPoolMachine = EasyPoolMachine.TestCase


class SharedMemoryPoolMachine(EasyPoolMachine):
    """GPUs 0 and 1 draw on one memory (two MIG compute instances of one GPU instance, as in
    the H200 MIG capture; issue 36): what is granted on both together stays within one GPU,
    and each one's free share is the least of its own and its group's."""

    GROUP = (0, 1)

    def __init__(self) -> None:
        super().__init__()
        gpus = (
            GPUInfo(0, "0", memory_group="gi2"),
            GPUInfo(1, "1", memory_group="gi2"),
            GPUInfo(2, "2"),
        )
        self.backend = LocalBackend(gpus, clock=lambda: 0.0)
        self.pool = GPUPool(backend=self.backend)

    @rule(count=st.integers(1, NUM_GPUS - 1), zero_timeout=st.booleans())
    def acquire_full(self, count: int, zero_timeout: bool) -> None:
        """At most two whole GPUs: three would need two of one memory."""
        coro = self.pool.acquire_full(count, timeout=0 if zero_timeout else None)
        self.start(coro, 1.0)

    @invariant()
    def every_unit_accounted_for(self) -> None:
        """Replaced: a GPU of the group sees what the group has left."""
        free = self.pool.snapshot().free
        on = [sum(f for g, f in self.held if g == gpu) for gpu in range(NUM_GPUS)]
        group = sum(on[gpu] for gpu in self.GROUP)
        assert group <= 1.0 + 1e-9, ("the group holds more than its memory", self.held)
        for gpu in range(NUM_GPUS):
            room = 1.0 - group if gpu in self.GROUP else 1.0
            assert abs(free[gpu] - min(1.0 - on[gpu], room)) < 1e-9, (gpu, free, self.held)


SharedMemoryPoolMachine.TestCase.settings = PoolMachine.TestCase.settings
TestSharedMemoryPoolMachine = SharedMemoryPoolMachine.TestCase
