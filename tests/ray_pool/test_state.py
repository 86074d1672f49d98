"""The cluster state of the Ray scheduler actor, driven directly (pure: no cluster needed)."""

from __future__ import annotations

import heapq
import random

import pytest

pytest.importorskip("ray")

from hypothesis import given, settings
from hypothesis import strategies as st

from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from hwpool.ray._state import ClusterState, Key, MemoryDemand, NodeGPU, Outcome, Placement

FULL = UNITS_PER_GPU


def gpus(count: int, prefix: str = "") -> list[NodeGPU]:
    return [NodeGPU(i, f"{prefix}{i}") for i in range(count)]


def frac(f: float) -> Demand:
    return Demand(1, round(f * FULL))


def whole(n: int) -> Demand:
    return Demand(n, FULL)


def two_by_two() -> ClusterState:
    state = ClusterState()
    state.add_node("A", gpus(2, "GPU-a"))
    state.add_node("B", gpus(2, "GPU-b"))
    return state


def placed(out: Outcome) -> dict[Key, tuple[str, tuple[int, ...]]]:
    return {p.key: (p.node_id, p.gpus) for p in out.placed}


def check(state: ClusterState) -> None:
    """Every GPU: lease units + free units == one GPU; leases on one node each; the head's
    reservation on one node; nothing both leased and waiting."""
    used: dict[tuple[str, int], int] = {}
    for lease in state.leases():
        assert lease.node_id in state.nodes
        assert len(set(lease.gpus)) == len(lease.gpus)
        for g in lease.gpus:
            used[lease.node_id, g] = used.get((lease.node_id, g), 0) + lease.units
    for node, node_gpus in state.nodes.items():
        for gpu in node_gpus:
            here = (node, gpu.index)
            assert used.get(here, 0) + state.free_units(node, gpu.index) == FULL
    assert len({node for node, _ in state.reserved()}) <= 1
    for key, _ in state.waiting():
        assert state.lease(key) is None


def test_fractions_best_fit_across_nodes_and_devices_follow_the_node() -> None:
    state = two_by_two()
    out = state.request(("c", 1), frac(0.5))
    assert placed(out) == {("c", 1): ("A", (0,))}
    assert out.placed[0].devices == ("GPU-a0",)
    state.request(("c", 2), whole(1))  # A1
    state.request(("c", 3), whole(1))  # B0
    out = state.request(("c", 4), frac(0.5))  # best fit: the half-used A0
    assert placed(out) == {("c", 4): ("A", (0,))}
    out = state.request(("c", 5), frac(0.25))
    assert placed(out) == {("c", 5): ("B", (1,))}
    assert out.placed[0].devices == ("GPU-b1",)
    check(state)


def busy_corners() -> ClusterState:
    """A0 and B1 held whole, A1 and B0 idle: two idle GPUs, but not on one node."""
    state = two_by_two()
    for i in range(4):
        state.request(("c", i), whole(1))
    state.release(("c", 1))
    state.release(("c", 2))
    return state


def test_a_multi_gpu_request_waits_for_one_node_and_reserves_it() -> None:
    """Two idle GPUs on two nodes make no 2-GPU lease: the request reserves one node (A, the
    first of equals), and a small request uses the idle GPU of the other."""
    state = busy_corners()
    out = state.request(("big", 1), whole(2))
    assert out.placed == []
    assert state.is_waiting(("big", 1))
    assert [key for key, _ in state.waiting()] == [("big", 1)]
    assert state.reserved() == [("A", 0), ("A", 1)]
    check(state)
    out = state.request(("small", 1), frac(0.25))
    assert placed(out) == {("small", 1): ("B", (0,))}
    assert state.lease(("small", 1)) == Placement(("small", 1), "B", (0,), ("GPU-b0",), FULL // 4)
    out = state.request(("small", 2), frac(0.25))  # A1 is reserved: best fit on B0 again
    assert placed(out) == {("small", 2): ("B", (0,))}
    out = state.release(("c", 0))  # A0 drains: node A holds the big request
    assert placed(out) == {("big", 1): ("A", (0, 1))}
    assert state.reserved() == []
    check(state)


def test_a_head_is_placed_on_the_first_node_to_drain() -> None:
    state = busy_corners()
    state.request(("big", 1), whole(2))  # reserves A
    out = state.request(("big", 2), whole(2))  # waits behind it
    assert out.placed == []
    out = state.release(("c", 3))  # B drains first: the head fits there, so it goes there
    assert placed(out) == {("big", 1): ("B", (0, 1))}
    assert state.reserved() == [("A", 0), ("A", 1)]  # the next head's
    check(state)
    out = state.release(("c", 0))
    assert placed(out) == {("big", 2): ("A", (0, 1))}
    check(state)


def test_cancelling_the_head_frees_its_reservation() -> None:
    state = busy_corners()
    state.request(("big", 1), whole(2))
    state.cancel(("big", 1))
    assert state.reserved() == [] and state.waiting() == []
    assert state.snapshot().nodes[0].free == (0.0, 1.0)
    check(state)


def test_a_request_larger_than_every_node_fails_at_once_and_changes_nothing() -> None:
    state = two_by_two()
    before = state.snapshot()
    with pytest.raises(
        ValueError, match=r"gpus=3 is more than any node of the cluster has \(the largest has 2\)"
    ):
        state.request(("c", 1), whole(3))
    assert state.snapshot() == before
    with pytest.raises(ValueError, match="no GPUs"):
        ClusterState().request(("c", 1), frac(0.5))


def test_a_known_key_is_refused() -> None:
    state = two_by_two()
    state.request(("c", 1), frac(0.5))
    with pytest.raises(ValueError, match="already known"):
        state.request(("c", 1), frac(0.5))


def test_removing_a_node_loses_its_leases_frees_nothing_twice_and_fails_what_cannot_fit() -> None:
    state = two_by_two()
    state.add_node("C", gpus(4))
    for i in range(4):
        state.request(("c", i), whole(1))  # A0 A1 B0 B1
    state.request(("big", 1), whole(4))  # on C
    state.request(("c", 9), whole(1))  # waits
    state.request(("big", 2), whole(3))  # waits; only C could ever hold it
    out = state.remove_node("C")
    assert [p.key for p in out.lost] == [("big", 1)]
    assert out.failed == [
        (("big", 2), "gpus=3 is more than any node of the cluster has (the largest has 2)")
    ]
    assert state.release(("big", 1)) == Outcome()  # lost with its node: nothing to free
    assert [key for key, _ in state.waiting()] == [("c", 9)]
    out = state.release(("c", 2))
    assert placed(out) == {("c", 9): ("B", (0,))}
    check(state)
    assert state.remove_node("C") == Outcome()


def test_a_joining_node_serves_the_queue_in_order() -> None:
    state = two_by_two()
    for i in range(4):
        state.request(("c", i), whole(1))
    state.request(("w", 1), frac(0.5))
    state.request(("w", 2), whole(2))
    out = state.add_node("C", gpus(2))
    assert placed(out) == {("w", 1): ("C", (0,))}  # the 2-GPU request then reserves C
    out = state.add_node("D", gpus(2))
    assert placed(out) == {("w", 2): ("D", (0, 1))}
    check(state)


def test_drop_client_withdraws_its_waiters_and_releases_its_leases() -> None:
    state = two_by_two()
    state.request(("gone", 1), whole(2))
    state.request(("gone", 2), whole(2))
    state.request(("gone", 3), whole(2))  # waits
    state.request(("live", 1), frac(0.5))  # waits behind it
    out = state.drop_client("gone")
    assert placed(out) == {("live", 1): ("A", (0,))}
    assert state.leases() == [state.lease(("live", 1))]
    assert state.waiting() == []
    check(state)


def test_restore_keeps_what_still_fits_and_requeues_in_the_order_given() -> None:
    state = two_by_two()
    leases = [
        Placement(("x", 1), "A", (0, 1), ("GPU-a0", "GPU-a1"), FULL),
        Placement(("y", 1), "A", (0,), ("GPU-a0",), FULL // 2),  # A0 is taken: lost
        Placement(("y", 2), "Z", (0,), ("0",), FULL // 2),  # unknown node: lost
        Placement(("y", 3), "B", (1,), ("GPU-b1",), FULL // 2),
    ]
    waiting = [(("w", 2), whole(2)), (("w", 1), frac(0.5)), (("x", 1), frac(0.5))]
    out = state.restore(leases, waiting)
    assert [p.key for p in out.lost] == [("y", 1), ("y", 2)]
    # w2 (first) waits for two GPUs and reserves B; w1 backfills nowhere else; x1 is leased.
    assert [key for key, _ in state.waiting()] == [("w", 2), ("w", 1)]
    assert {p.key for p in state.leases()} == {("x", 1), ("y", 3)}
    check(state)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("node"), st.sampled_from("ABC"), st.integers(1, 3)),
        st.tuples(st.just("drop_node"), st.sampled_from("ABC"), st.just(0)),
        st.tuples(
            st.just("ask"), st.sampled_from("xyz"), st.sampled_from([0.25, 0.5, 0.3, 1, 2, 3])
        ),
        st.tuples(st.just("release"), st.just(""), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.just(""), st.integers(0, 50)),
        st.tuples(st.just("drop_client"), st.sampled_from("xyz"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_random_steps_keep_the_invariants_and_everything_is_served_in_the_end(
    ops: list[tuple[str, str, float]],
) -> None:
    state = ClusterState()
    asked: list[Key] = []
    for op, name, value in ops:
        if op == "node":
            state.add_node(name, gpus(int(value)))
        elif op == "drop_node":
            state.remove_node(name)
        elif op == "ask":
            demand = whole(int(value)) if value >= 1 else frac(value)
            key = (name, len(asked))
            if state.infeasible(demand) is None:
                state.request(key, demand)
                asked.append(key)
        elif op in ("release", "cancel") and asked:
            key = asked[int(value) % len(asked)]
            (state.release if op == "release" else state.cancel)(key)
        elif op == "drop_client":
            state.drop_client(name)
        check(state)
    while state.leases():  # releasing everything serves every request still waiting
        state.release(state.leases()[0].key)
        check(state)
    assert state.waiting() == [] and state.reserved() == []
    for node in state.snapshot().nodes:
        assert node.free == (1.0,) * len(node.gpus)


def test_a_cluster_without_gpus_names_the_demand_asked_and_the_way_out() -> None:
    for demand, asked in [
        (frac(0.25), "fraction=0.25"),
        (whole(1), "one GPU"),
        (whole(2), "gpus=2"),
    ]:
        with pytest.raises(ValueError) as raised:
            ClusterState().request(("c", 1), demand)
        message = str(raised.value)
        assert asked in message and "no GPUs" in message, message
        assert "ray.init(num_gpus=" in message, message


# ----------------------------------------------------------------- a 2-GPU task in a stream
TASK_S = (0.5, 1.5)  # the small tasks' lengths, uniform in this range


def wide_task_in_a_stream(
    seed: int,
    tasks: int = 300,
    rate: float = 9.0,
    shares: tuple[float, ...] = (0.25, 0.5),
    nodes: int = 2,
) -> tuple[float, int]:
    """The cluster state driven as the scheduler actor drives it, in virtual time: ``nodes``
    nodes x 2 GPUs, ``tasks`` small tasks (of ``shares``) arriving at ``rate`` a second (by
    default 300 quarter and half tasks at 9 a second, more than 2 nodes serve), and one
    2-GPU task arriving among them.

    Returns how long the 2-GPU task waited once everything queued before it was placed (it is
    then the head of the queue), and how many small tasks that came after it were placed
    before it.
    """
    rng = random.Random(seed)
    state = ClusterState()
    for node in range(nodes):
        state.add_node(f"node{node}", gpus(2))
    arrivals: list[tuple[float, Key, Demand, float]] = []
    at = 0.0
    for i in range(tasks):
        at += rng.expovariate(rate)
        arrivals.append((at, ("small", i), frac(rng.choice(shares)), rng.uniform(*TASK_S)))
    wide_at = rng.uniform(2.0, 10.0)
    arrivals.append((wide_at, ("wide", 0), whole(2), 1.0))
    arrivals.sort()
    length = {key: seconds for _, key, _, seconds in arrivals}
    placed_at: dict[Key, float] = {}
    ends: list[tuple[float, Key]] = []
    now = 0.0

    def started(out: Outcome) -> None:
        for p in out.placed:
            assert len(p.gpus) == len(set(p.gpus))
            placed_at[p.key] = now
            heapq.heappush(ends, (now + length[p.key], p.key))

    pending = iter(arrivals)
    upcoming = next(pending, None)
    while upcoming is not None or ends:
        if upcoming is not None and (not ends or upcoming[0] <= ends[0][0]):
            now, key, demand, _ = upcoming
            started(state.request(key, demand, now=now))
            upcoming = next(pending, None)
        else:
            now, key = heapq.heappop(ends)
            started(state.release(key, now=now))
        check(state)
    assert state.waiting() == [] and state.leases() == []
    wide = placed_at["wide", 0]
    ahead = [placed_at[k] for t, k, _, _ in arrivals if k[0] == "small" and t < wide_at]
    passed = sum(
        1 for t, k, _, _ in arrivals if k[0] == "small" and t > wide_at and placed_at[k] < wide
    )
    return wide - max([wide_at, *ahead]), passed


def test_a_two_gpu_task_waits_at_most_about_one_task_length_as_head() -> None:
    """docs/ray.md: once at the head, the 2-GPU task gets a node within about one task's
    length (what runs on the node it reserves ends; nothing new goes there), while the rest
    of the stream keeps every other GPU busy. Issue 25: before the core knew nodes, a grant
    across nodes was hoarded idle, the hoard's whole-GPU placeholder at the head reserved a
    hoarded GPU (which never frees) and small tasks filled the rest: 18 of these 60 seeds
    waited longer, 14 of them 41 to 54 s (until the stream ran dry), passed by 220 to 279
    later tasks. Now the longest wait is 1.44 s."""
    waits = {seed: wide_task_in_a_stream(seed) for seed in range(60)}
    late = {seed: w for seed, w in waits.items() if w[0] > TASK_S[1]}
    assert not late, f"waited longer than one task ({TASK_S[1]} s) as head: {late}"


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rate=st.floats(4.0, 16.0),
    shares=st.sampled_from([(0.25,), (0.25, 0.5), (0.25, 0.5, 1.0), (0.5, 1.0), (0.3, 0.7)]),
    nodes=st.integers(2, 3),
)
def test_a_two_gpu_task_as_head_waits_at_most_one_task_length_whatever_the_stream(
    seed: int, rate: float, shares: tuple[float, ...], nodes: int
) -> None:
    """The bound of docs/ray.md over streams of other shapes, rates and cluster sizes (each
    shorter: 120 tasks): what runs on the node the head reserves ends within one task's
    length, and nothing new goes there. (A head may move once past its shadow; the bound
    then counts from the move, but the move never took it past one task's length here.)"""
    wait, _ = wide_task_in_a_stream(seed, 120, rate, shares, nodes)
    assert wait <= TASK_S[1]


def sized(count: int, mib: int, prefix: str) -> list[NodeGPU]:
    return [NodeGPU(i, f"{prefix}{i}", None, mib) for i in range(count)]


def two_sizes() -> ClusterState:
    """One 16 GiB GPU on node "small", one 80 GiB GPU on node "big"."""
    state = ClusterState()
    state.add_node("small", sized(1, 16384, "s"))
    state.add_node("big", sized(1, 81920, "b"))
    return state


def test_memory_demands_fit_each_gpus_own_size() -> None:
    state = two_sizes()
    assert placed(state.request(("c", 1), MemoryDemand(1, 20000))) == {("c", 1): ("big", (0,))}
    # best fit: 16 GiB fills the small GPU exactly, not the 60 GiB left on the big one
    assert placed(state.request(("c", 2), MemoryDemand(1, 16384))) == {("c", 2): ("small", (0,))}
    assert placed(state.request(("c", 3), MemoryDemand(1, 61920))) == {("c", 3): ("big", (0,))}
    assert not state.request(("c", 4), MemoryDemand(1, 1)).placed  # nothing left: it waits
    snap = state.snapshot()
    leases = {lease.request: lease for lease in snap.leases}
    assert (leases[1].memory_mib, leases[2].fraction) == (20000, 1.0)
    assert (snap.waiting[0].memory_mib, snap.waiting[0].count) == (1, 1)
    assert placed(state.release(("c", 2))) == {("c", 4): ("small", (0,))}
    assert state.free_units("small", 0) == 16383 and state.free_units("big", 0) == 0


def test_fractions_and_whole_gpus_on_gpus_of_two_sizes_are_shares_of_the_gpu_they_get() -> None:
    state = two_sizes()
    (half,) = state.request(("c", 1), frac(0.5)).placed
    size = 16384 if half.node_id == "small" else 81920
    assert half.units == size // 2 and state.free_units(half.node_id, 0) == size // 2
    (gpu,) = state.request(("c", 2), whole(1)).placed  # the idle GPU, whatever its size
    assert gpu.node_id != half.node_id
    assert state.snapshot().nodes[0].free[0] in (0.0, 0.5)
    state.release(("c", 2))
    state.release(("c", 1))
    assert [state.free_units(n, 0) for n in ("small", "big")] == [16384, 81920]
    assert state.restore([half], [], now=None).lost == []  # a restart restores it
    assert state.free_units(half.node_id, 0) == size // 2


def test_memory_beyond_every_gpu_or_of_unknown_sizes_is_refused_naming_it() -> None:
    state = two_sizes()
    with pytest.raises(ValueError, match=r"memory=90000MiB is more than any GPU .* 81920 MiB"):
        state.request(("c", 1), MemoryDemand(1, 90000))
    unsized = two_by_two()
    with pytest.raises(ValueError, match=r"memory=1024MiB needs the memory .* hwpool_gpu_mib"):
        unsized.request(("c", 1), MemoryDemand(1, 1024))
    assert state.waiting() == [] and unsized.waiting() == [] and not state.leases()
