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
