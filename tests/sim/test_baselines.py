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


# A share of whichever GPU (on GPUs of different sizes): half of 100 is 50, half of 40 is 20.
SHARE = Demand(1, 63_000_000 // 2, relative=True)


def test_fifo_best_fit_weighs_a_relative_demands_need_on_each_gpu() -> None:
    fifo = FifoPolicy(2, WHOLE, [100, 40])
    assert fifo.submit(1, Demand(1, 45)) == [(1, (0,))]  # 55 left on GPU 0 (40 on GPU 1)
    assert fifo.submit(2, SHARE) == [(2, (0,))]  # 5 left on GPU 0, 20 on GPU 1
    assert fifo.free == [5, 40]
    assert fifo.submit(3, SHARE) == [(3, (1,))]
    assert fifo.submit(4, SHARE) == [(4, (1,))]  # exactly the 20 left there
    assert fifo.submit(5, SHARE) == []  # 5 and 0 free
    assert fifo.finish(2) == [(5, (0,))]  # 55 free on GPU 0: its 50 fit
    assert fifo.free == [5, 0]
    assert fifo.finish(1) == [] and fifo.free == [50, 0]


def test_first_fit_and_shortest_queue_hold_a_relative_demands_share() -> None:
    greedy = FirstFitPolicy(2, WHOLE, [100, 40])
    assert greedy.submit(1, SHARE) == [(1, (0,))]
    assert greedy.submit(2, SHARE) == [(2, (0,))]
    assert greedy.submit(3, SHARE) == [(3, (1,))]
    assert greedy.submit(4, SHARE) == [(4, (1,))]
    assert greedy.submit(5, SHARE) == [] and greedy.free == [0, 0]
    assert greedy.finish(3) == [(5, (1,))]
    lanes = ShortestQueuePolicy(2, WHOLE, [100, 40])
    assert lanes.submit(1, SHARE) == [(1, (0,))]
    assert lanes.submit(2, SHARE) == [(2, (1,))]
    assert lanes.free == [50, 20]
    lanes.finish(1)
    lanes.finish(2)
    assert lanes.free == [100, 40]
