"""The hysteresis on memory outside the queue: examples, bad rules, and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwpool._watch import Hold, HoldRule, OutsideHold, hold_step

A, B = "GPU-aaaa", "GPU-bbbb"


def test_memory_outside_is_withheld_after_it_persists_and_given_back_after_it_is_gone() -> None:
    hold = OutsideHold(HoldRule(take_samples=3, give_samples=2))
    assert hold.observe({A: 5000, B: 0}, 0.0) == {A: 0, B: 0}
    assert hold.observe({A: 5200, B: 0}, 2.0) == {A: 0, B: 0}
    assert hold.observe({A: 5100, B: 0}, 4.0) == {A: 5000, B: 0}  # the least of the run
    assert hold.observe({A: 0, B: 0}, 6.0) == {A: 5000, B: 0}
    assert hold.observe({A: 0, B: 0}, 8.0) == {A: 0, B: 0}


def test_a_spike_shorter_than_the_rule_changes_nothing() -> None:
    hold = OutsideHold(HoldRule(take_samples=3))
    for now, seen in enumerate([0, 70000, 70000, 0, 70000, 0]):
        assert hold.observe({A: seen}, float(now)) == {A: 0}


def test_taking_also_waits_for_the_seconds() -> None:
    hold = OutsideHold(HoldRule(take_samples=2, take_seconds=10.0))
    assert [hold.observe({A: 800}, now)[A] for now in (0.0, 1.0, 9.0, 10.0)] == [0, 0, 0, 800]


def test_an_unknown_sample_neither_grows_nor_ends_a_run() -> None:
    hold = OutsideHold(HoldRule(take_samples=2))
    assert hold.observe({A: 900}, 0.0) == {A: 0}
    assert hold.observe({A: None}, 1.0) == {A: 0}
    assert hold.observe({}, 2.0) == {A: 0}  # a GPU missing from a sample: unknown too
    assert hold.observe({A: 900}, 3.0) == {A: 900}


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"take_samples": 0}, ValueError, "take_samples must be >= 1, got 0"),
        ({"give_samples": True}, TypeError, "give_samples must be an int, got True (bool)"),
        ({"take_seconds": -1.0}, ValueError, "take_seconds must be >= 0 and finite, got -1.0"),
        ({"take_seconds": math.inf}, ValueError, "take_seconds must be >= 0 and finite, got inf"),
        ({"take_seconds": "1"}, TypeError, "take_seconds must be a real number, got '1' (str)"),
    ],
)
def test_a_bad_rule_names_the_argument_and_value(
    arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        HoldRule(**arguments)  # type: ignore[arg-type]
    assert str(raised.value) == message


rules = st.builds(
    HoldRule,
    take_samples=st.integers(1, 5),
    take_seconds=st.sampled_from([0.0, 1.0, 5.0]),
    give_samples=st.integers(1, 5),
)
readings = st.lists(
    st.tuples(st.none() | st.integers(0, 2000), st.sampled_from([0.0, 0.5, 2.0])), max_size=60
)


def run(rule: HoldRule, steps: list[tuple[int | None, float]]) -> list[Hold]:
    """The states after each step, the clock advancing by each step's delay."""
    hold, now, states = Hold(), 0.0, []
    for seen, delay in steps:
        now += delay
        hold = hold_step(hold, seen, now, rule)
        states.append(hold)
    return states


@given(rules, readings)
def test_what_is_withheld_was_seen_for_a_whole_run(
    rule: HoldRule, steps: list[tuple[int | None, float]]
) -> None:
    before, streak = 0, []  # the known samples since the last change, all on one side
    for (seen, _), hold in zip(steps, run(rule, steps), strict=True):
        if seen is None:
            assert hold.withheld == before  # an unknown sample changes nothing
            continue
        side = (seen > before) - (seen < before)
        streak = (
            [*streak, seen]
            if streak and (streak[0] > before) - (streak[0] < before) == side
            else [seen]
        )
        if hold.withheld > before:  # taken: a rising run of take_samples or more; its least
            assert side == 1 and len(streak) >= rule.take_samples
            assert hold.withheld == min(streak)
        elif hold.withheld < before:  # given back: a falling run of give_samples; its most
            assert side == -1 and len(streak) == rule.give_samples
            assert hold.withheld == max(streak)
        if hold.withheld != before or side == 0:
            streak = []
        before = hold.withheld


@given(rules, st.integers(0, 2000), st.lists(st.integers(0, 4000), min_size=1, max_size=5))
def test_a_spike_shorter_than_take_samples_leaves_a_steady_hold(
    rule: HoldRule, steady: int, spike: list[int]
) -> None:
    settle = [(steady, 10.0)] * (max(rule.take_samples, rule.give_samples) + 1)
    before = run(rule, settle)[-1].withheld
    assert before == steady
    short = [(mib, 10.0) for mib in spike[: rule.take_samples - 1] if mib > steady]
    after = run(rule, [*settle, *short, (steady, 10.0)])
    assert all(hold.withheld == steady for hold in after[len(settle) :])


@given(rules, readings, st.integers(0, 2000))
def test_a_steady_amount_is_withheld_in_the_end(
    rule: HoldRule, steps: list[tuple[int | None, float]], steady: int
) -> None:
    # Two runs: the first may have begun before the steady amount (its bound then lies
    # between); each run is one sample more than the rule's count, as the run's first sample
    # starts its clock (take_seconds).
    settle = [(steady, 10.0)] * 2 * (max(rule.take_samples, rule.give_samples) + 1)
    assert run(rule, [*steps, *settle])[-1].withheld == steady
