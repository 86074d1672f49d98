"""The client's ordering of a driver's calls (pure asyncio: no cluster)."""

from __future__ import annotations

import asyncio
from typing import Any

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


def test_a_call_cancelled_while_it_waits_its_turn_lets_the_later_ones_through() -> None:
    async def main() -> list[int]:
        turns = Turns(patience_s=60)
        order: list[int] = []

        async def call(number: int) -> None:
            await turns.wait(number)
            order.append(number)

        later = [asyncio.create_task(call(n)) for n in (3, 2)]
        await asyncio.sleep(0)  # both wait for 1
        later[1].cancel()  # 2 will never come through
        await asyncio.wait_for(asyncio.gather(call(1), later[0]), 10)
        assert later[1].cancelled()
        return order

    assert asyncio.run(main()) == [1, 3]


def test_the_scheduler_queues_a_clients_requests_in_the_order_sent_whatever_order_they_start() -> (
    None
):
    # Ray starts an async actor's calls in any order (seen: sent 1..25, started 1..5, 12, 6...).
    from hwpool._core._capacity import UNITS_PER_GPU  # noqa: PLC0415
    from hwpool.ray._actor import SchedulerActor  # noqa: PLC0415
    from hwpool.ray._state import NodeGPU  # noqa: PLC0415

    class Client:  # stands in for the client actor's handle: takes the pushed grants
        def __init__(self) -> None:
            self.granted = self
            self.grants: list[Any] = []

        def remote(self, grants: list[Any], keep: object) -> None:
            self.grants += grants

    async def scenario() -> tuple[list[int], list[Any]]:
        actor = SchedulerActor("test")
        actor._state.add_node("A", [NodeGPU(0, "0")])
        started = asyncio.get_running_loop().create_future()
        started.set_result(None)
        actor._started = started  # type: ignore[assignment]  # nodes known: no Ray here
        actor._watched.add("c")  # and no Ray to watch the client through
        client = Client()

        def batch(number: int) -> list[Any]:
            return [("request", number, 1, UNITS_PER_GPU, False)]

        await actor.submit("c", 1, batch(1), client)  # holds the only GPU
        arrival = [2, 3, 4, 5, 6, 13, 7, 8, 9, 10, 11, 12, *range(14, 27)]
        calls = [asyncio.create_task(actor.submit("c", n, batch(n), client)) for n in arrival]
        await asyncio.gather(*calls)  # each returns once its batch is queued
        await asyncio.sleep(0)  # the grants of a loop turn are pushed at its end
        queued = [number for (_, number), _ in actor._state.waiting()]
        return queued, [(number, reason) for number, _, reason in client.grants]

    queued, grants = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert queued == list(range(2, 27))
    assert grants == [(1, None)]  # the first granted, the rest wait


def test_a_restarted_scheduler_is_told_a_drivers_waiting_calls_in_the_drivers_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ray started the driver's second call before its first: what the client says it waits
    # for (and since when) must still put the first first, as the restored queue will.
    from hwpool._core._capacity import UNITS_PER_GPU  # noqa: PLC0415
    from hwpool._core._scheduler import Demand  # noqa: PLC0415
    from hwpool.ray import _client  # noqa: PLC0415

    class Scheduler:  # stands in for the scheduler actor's handle: takes the batches
        def __init__(self) -> None:
            self.submit = self
            self.batches: list[Any] = []

        def remote(self, *batch: Any) -> asyncio.Future[None]:
            self.batches.append(batch)
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    scheduler = Scheduler()
    monkeypatch.setattr(_client._api, "get_actor", lambda name, namespace: scheduler)
    monkeypatch.setattr(_client._api, "current_actor", lambda: "client handle")

    async def scenario() -> list[Demand]:
        client = _client.ClientActor("scheduler", "test", "c")
        options = _client.TaskOptions()
        half = _client.Call(1, 1, UNITS_PER_GPU // 2, options)
        whole = _client.Call(2, 1, UNITS_PER_GPU, options)
        second = asyncio.create_task(client._acquire(whole.demand, whole.seq))
        await asyncio.sleep(0)  # it waits for its turn
        first = asyncio.create_task(client._acquire(half.demand, half.seq))
        while sum(len(batch[2]) for batch in scheduler.batches) < 2:
            await asyncio.sleep(0)  # both through their turns, their requests sent
        _, waiting, _ = await client.held()
        for call in (first, second):
            call.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        return [demand for _, demand, _ in sorted(waiting, key=lambda w: w[2])]

    order = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert order == [Demand(1, UNITS_PER_GPU // 2), Demand(1, UNITS_PER_GPU)]


@pytest.mark.parametrize("ended", [True, False])
def test_a_cancelled_run_kills_its_task_only_if_it_still_runs(
    monkeypatch: pytest.MonkeyPatch, ended: bool
) -> None:
    # A cancel that crosses a task's last reply can end the client's process in Ray 2.x
    # (ray-project/ray#54527): a task Ray says has ended is left alone.
    from hwpool.ray import _client  # noqa: PLC0415

    cancelled: list[object] = []

    class Ref:  # awaited as an ObjectRef is: cancelling the wait leaves the task's result
        def __init__(self, result: asyncio.Future[str]) -> None:
            self.result = result

        def __await__(self) -> Any:
            return asyncio.shield(self.result).__await__()

    async def scenario() -> None:
        task_result: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        monkeypatch.setattr(
            _client._api,
            "wait",
            lambda refs, num_returns, timeout: (refs, []) if ended else ([], refs),
        )

        def cancel(ref: object, force: bool) -> None:
            cancelled.append(ref)
            task_result.set_exception(RuntimeError("cancelled"))

        monkeypatch.setattr(_client._api, "cancel", cancel)
        run = asyncio.create_task(_client._outcome(Ref(task_result)))
        await asyncio.sleep(0)  # it awaits the task's result
        run.cancel()
        if ended:
            task_result.set_result("done")
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert len(cancelled) == (0 if ended else 1)
