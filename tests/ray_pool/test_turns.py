"""The client's ordering of a driver's calls (pure asyncio: no cluster)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")

from hwpool.ray._turns import Turns


async def through(turns: Turns, numbers: list[int]) -> list[int]:
    """Start a call per number, in the order given; return the order they got through."""
    order: list[int] = []

    async def call(number: int) -> None:
        await turns.wait(number)
        order.append(number)

    tasks = [asyncio.create_task(call(n)) for n in numbers]
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    return order


def test_calls_go_through_in_number_order_whatever_order_they_arrive_in() -> None:
    turns = Turns(patience_s=60)
    assert asyncio.run(through(turns, [3, 1, 5, 2, 4])) == [1, 2, 3, 4, 5]
    assert turns.next == 6


def test_a_skipped_number_lets_the_later_ones_through() -> None:
    async def main() -> list[int]:
        turns = Turns(patience_s=60)
        waiting = asyncio.create_task(through(turns, [3, 1]))
        await turns.skip(2)  # before or after they arrive: the same
        return await waiting

    assert asyncio.run(main()) == [1, 3]


def test_an_overdue_number_stops_holding_the_others_up_and_passes_when_late() -> None:
    async def main() -> tuple[list[int], list[int], int]:
        turns = Turns(patience_s=0.01)
        first = await through(turns, [3, 1])  # 2 never comes in time
        late = await through(turns, [2])  # and passes at once when it does
        return first, late, turns.next

    assert asyncio.run(main()) == ([1, 3], [2], 4)


def test_the_scheduler_queues_a_clients_requests_in_the_order_sent_whatever_order_they_start() -> (
    None
):
    # Ray starts an async actor's calls in any order (seen: sent 1..25, started 1..5, 12, 6...).
    from hwpool._core._capacity import UNITS_PER_GPU  # noqa: PLC0415
    from hwpool.ray._actor import SchedulerActor  # noqa: PLC0415
    from hwpool.ray._state import NodeGPU  # noqa: PLC0415

    async def scenario() -> list[int]:
        actor = SchedulerActor("test")
        actor._state.add_node("A", [NodeGPU(0, "0")])
        started = asyncio.get_running_loop().create_future()
        started.set_result(None)
        actor._started = started  # type: ignore[assignment]  # nodes known: no Ray here
        actor._watched.add("c")  # and no Ray to watch the client through
        await actor.request("c", 1, 1, UNITS_PER_GPU, 1)  # holds the only GPU
        arrival = [2, 3, 4, 5, 6, 13, 7, 8, 9, 10, 11, 12, *range(14, 27)]
        calls = [asyncio.create_task(actor.request("c", n, 1, UNITS_PER_GPU, n)) for n in arrival]
        for _ in range(10_000):  # until all have reached the queue (bounded)
            if len(actor._state.waiting()) == len(arrival):
                break
            await asyncio.sleep(0)
        queued = [number for (_, number), _ in actor._state.waiting()]
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        return queued

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == list(range(2, 27))
