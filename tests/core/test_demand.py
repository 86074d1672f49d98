"""make_demand, with_terms and Demands: what each request becomes, and the bad requests."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._demand import Demands, make_demand, share_on, with_terms
from hwpool._core._scheduler import Demand, Scheduler

HALF = UNITS_PER_GPU // 2
EQUAL = (81920, 81920)
MIXED = (81920, 24576)


@pytest.mark.parametrize(
    ("kwargs", "demand"),
    [
        ({}, Demand(1, UNITS_PER_GPU)),
        ({"fraction": 0.5}, Demand(1, HALF)),
        ({"fraction": Fraction(1, 3)}, Demand(1, UNITS_PER_GPU // 3)),
        ({"units": 7}, Demand(1, 7)),
        ({"count": 3}, Demand(3, UNITS_PER_GPU)),
        ({"count": 2, "fraction": 1.0}, Demand(2, UNITS_PER_GPU)),
        ({"fraction": 0.5, "units_per_gpu": 100}, Demand(1, 50)),
        ({"count": 2, "units": 100, "units_per_gpu": 100}, Demand(2, 100)),
        ({"fraction": 0.5, "totals": EQUAL}, Demand(1, 40960)),
        ({"fraction": 0.5, "totals": MIXED}, Demand(1, HALF, relative=True)),
        ({"fraction": 0.5, "totals": EQUAL, "keep_shares": True}, Demand(1, HALF, relative=True)),
        ({"totals": EQUAL}, Demand(1, 81920)),
        ({"count": 2, "totals": EQUAL}, Demand(2, 81920)),
        ({"count": 2, "totals": MIXED}, Demand(2, 81920, whole=True)),
        ({"totals": EQUAL, "keep_shares": True}, Demand(1, 81920, whole=True)),
        ({"memory": 6144, "totals": MIXED}, Demand(1, 6144)),
        ({"memory": "6GiB", "totals": MIXED}, Demand(1, 6144)),
        ({"memory": 100, "totals": EQUAL, "keep_shares": True}, Demand(1, 100)),
    ],
)
def test_each_kind_of_request_becomes_its_demand(kwargs: dict[str, object], demand: Demand) -> None:
    assert make_demand(**kwargs) == demand  # type: ignore[arg-type]


def test_a_share_of_one_size_of_gpu_rounds_up_as_the_core_does() -> None:
    mib = make_demand(fraction=0.3, totals=(1001,)).units
    assert mib == share_on(1001, make_demand(fraction=0.3).units) == math.ceil(0.3 * 1001)
    core = Scheduler([1001, 1001])
    relative = core.grant_now(make_demand(fraction=0.3, totals=(1001,), keep_shares=True))
    assert relative is not None
    assert relative.units == mib  # the core takes the kept share as that same amount


def test_owner_priority_and_limit_are_carried() -> None:
    demand = make_demand(fraction=0.5, owner="ana", priority=3, limit=2.5)
    assert (demand.owner, demand.priority, demand.limit) == ("ana", 3, 2.5)
    assert (demand.count, demand.units) == (1, HALF)
    assert make_demand(limit=4).limit == 4.0
    assert with_terms(Demand(1, HALF), "bo", 0, 1.0) == Demand(1, HALF, owner="bo", limit=1.0)


def test_without_terms_the_demand_is_returned_as_is() -> None:
    demand = Demand(1, HALF)
    assert with_terms(demand, None, 0, None) is demand


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"fraction": 0.0}, ValueError, "fraction must be in (0, 1], got 0.0"),
        ({"fraction": 1.5}, ValueError, "fraction must be in (0, 1], got 1.5"),
        ({"fraction": "half"}, TypeError, "fraction must be"),
        ({"fraction": math.nan}, ValueError, "fraction"),
        ({"units": 0}, ValueError, "units must be between 1 and"),
        ({"units": UNITS_PER_GPU + 1}, ValueError, "units must be between 1 and"),
        ({"units": 1.5}, TypeError, "units must be an int, got 1.5"),
        ({"count": 0}, ValueError, "count must be >= 1, got 0"),
        ({"count": 3, "num_gpus": 2}, ValueError, "count must be between 1 and num_gpus=2"),
        ({"count": 3, "totals": EQUAL}, ValueError, "count must be between 1 and num_gpus=2"),
        ({"count": True}, TypeError, "count must be an int, got True"),
        ({"count": 2, "fraction": 0.5}, ValueError, "count=2 with fraction=0.5"),
        ({"count": 2, "memory": 10, "totals": EQUAL}, ValueError, "count=2 with memory=10"),
        ({"fraction": 0.5, "units": 5}, TypeError, "fraction=0.5, units=5"),
        ({"fraction": 0.5, "memory": 10}, TypeError, "fraction=0.5, memory=10"),
        ({"memory": 10}, ValueError, "memory=10: this pool shares fractions"),
        ({"memory": "90GiB", "totals": MIXED}, ValueError, "more than the largest GPU"),
        ({"memory": "lots", "totals": MIXED}, ValueError, "memory must be"),
        ({"memory": 0, "totals": MIXED}, ValueError, "memory must be between 1"),
        ({"owner": ["a"]}, TypeError, "owner must be hashable, got ['a'] (list)"),
        ({"priority": 1.5}, TypeError, "priority must be an int, got 1.5"),
        ({"priority": True}, TypeError, "priority must be an int, got True"),
        ({"limit": 0.0}, ValueError, "limit_s must be a finite number of seconds > 0, got 0.0"),
        ({"limit": math.inf}, ValueError, "limit_s must be a finite number of seconds > 0"),
        ({"limit": -1}, ValueError, "limit_s must be a finite number of seconds > 0, got -1"),
        ({"limit": "1s"}, TypeError, "limit_s must be"),
    ],
)
def test_a_bad_request_names_the_argument_and_value(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as raised:
        make_demand(**kwargs)  # type: ignore[arg-type]
    assert words in str(raised.value)


def test_demands_memoise_float_fractions_and_amounts() -> None:
    memo = Demands(EQUAL, 2)
    first = memo.one(0.5, None)
    assert memo.one(0.5, None) is first
    assert memo.fractions[0.5] is first == Demand(1, 40960)
    assert memo.one(None, "6GiB") is memo.one(None, "6GiB")
    assert memo.one(None, None) == Demand(1, 81920)  # the default: one whole GPU
    assert memo.one(Fraction(1, 2), None) == first  # other types: checked every time


def test_demands_give_the_units_a_release_gives_back_on_each_gpu() -> None:
    memo = Demands(MIXED, 2)
    assert memo.units(1, 0.5, None) == 12288
    assert memo.units(0, 0.5, None) == 40960
    assert memo.units(1, None, None) == 24576  # the whole of that GPU
    assert memo.units(0, None, "1GiB") == 1024
    assert Demands(None, 4).units(3, 0.25, None) == UNITS_PER_GPU // 4


def test_demands_refuse_several_whole_mig_instances_and_bad_counts() -> None:
    memo = Demands(EQUAL, 2, single_whole=True)
    assert memo.whole(1) == Demand(1, 81920)
    with pytest.raises(ValueError, match="count=2: this pool's GPUs include MIG instances"):
        memo.whole(2)
    with pytest.raises(ValueError, match="count must be between 1 and num_gpus=4, got 5"):
        Demands(None, 4).whole(5)
    with pytest.raises(TypeError, match="fraction or memory, not both"):
        Demands(EQUAL, 2).units(0, 0.5, 10)
    assert Demands(None, 4).fractions == {}  # a failed call memoises nothing
