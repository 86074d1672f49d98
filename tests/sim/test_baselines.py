"""The baseline policies, driven directly (the simulator's tests cover them end to end)."""

from __future__ import annotations

from hwpool._core._scheduler import Demand
from hwpool._sim._baselines import FifoPolicy, FirstFitPolicy, ShortestQueuePolicy

WHOLE = 100
HALF = Demand(1, 50)
TWO = Demand(2, WHOLE)


def test_fifo_head_blocks_everything_behind_it() -> None:
    fifo = FifoPolicy(2, WHOLE)
    assert fifo.submit(1, HALF) == [(1, (0,))]
    assert fifo.submit(2, TWO) == []  # GPU 0 is half taken
    assert fifo.submit(3, HALF) == []  # would fit, but may not overtake task 2
    assert fifo.finish(1) == [(2, (0, 1))]
    assert fifo.finish(2) == [(3, (0,))]


def test_first_fit_lets_small_tasks_overtake() -> None:
    greedy = FirstFitPolicy(2, WHOLE)
    greedy.submit(1, HALF)
    assert greedy.submit(2, TWO) == []
    assert greedy.submit(3, HALF) == [(3, (0,))]  # first GPU that fits, not best fit
    assert greedy.submit(4, HALF) == [(4, (1,))]
    assert greedy.finish(1) == []  # GPU 1 is still taken: task 2 keeps waiting
    assert greedy.free == [50, 50]


def test_shortest_queue_places_at_arrival_and_serves_lanes_in_order() -> None:
    lanes = ShortestQueuePolicy(2, WHOLE)
    assert lanes.submit(1, Demand(1, WHOLE)) == [(1, (0,))]
    assert lanes.submit(2, HALF) == [(2, (1,))]  # GPU 1 has the shorter queue
    assert lanes.submit(3, TWO) == []  # joins both lanes
    assert lanes.submit(4, HALF) == []  # both loads are 2: lane 0, behind task 3
    assert lanes.load == [3, 2]
    assert lanes.finish(1) == []  # task 3 still needs GPU 1, held by task 2
    assert lanes.finish(2) == [(3, (0, 1))]
    assert lanes.finish(3) == [(4, (0,))]
    assert lanes.load == [1, 0]
