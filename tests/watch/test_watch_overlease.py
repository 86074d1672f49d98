"""Leases over their memory: the flag, the warning once, the ``term`` grace, ``off``, unknown
samples, and bad policies and shares."""

from __future__ import annotations

from fractions import Fraction

import pytest

from hwpool._watch import (
    GPUReading,
    LeaseShare,
    OverLeasePolicy,
    OverLeaseWatch,
    OverUse,
    Sample,
    parse_policy,
)

A, B = "GPU-aaaa", "GPU-bbbb"
LISTED = Sample("nvml", (GPUReading(A, 81920, 0, 0, ()), GPUReading(B, 24576, 0, 0, ())))
NO_B_TOTAL = Sample("nvml", (GPUReading(B, None, 0, 0, ()),))
UNLISTED = Sample("nvml", (GPUReading(A, 81920, 0, 0, None), GPUReading(B, 24576, 0, 0, ())))
WARN, TERM, OFF = OverLeasePolicy.WARN, OverLeasePolicy.TERM, OverLeasePolicy.OFF


def test_a_memory_lease_over_its_mib_is_flagged_and_warned_once() -> None:
    watch = OverLeaseWatch()
    share = [LeaseShare(1, A, memory_mib=20480)]
    assert watch.observe(LISTED, {(1, A): 20480}, share, 0.0) == []
    first = watch.observe(LISTED, {(1, A): 30000}, share, 2.0)
    assert first == [OverUse(1, A, 30000, 20480, 2.0, WARN, warn=True)]
    assert watch.observe(LISTED, {(1, A): 31000}, share, 4.0) == [
        OverUse(1, A, 31000, 20480, 2.0, WARN)  # still over, since 2.0; said already
    ]
    assert watch.observe(LISTED, {(1, A): 100}, share, 6.0) == []
    again = watch.observe(LISTED, {(1, A): 30000}, share, 8.0)
    assert again[0].warn and again[0].since == 8.0  # a new episode: said again


def test_a_fraction_lease_may_use_that_share_of_the_gpu_memory() -> None:
    watch = OverLeaseWatch()
    share = [LeaseShare(2, B, fraction=Fraction(1, 4))]  # 6144 MiB of 24576
    assert watch.observe(LISTED, {(2, B): 6144}, share, 0.0) == []
    assert watch.observe(LISTED, {(2, B): 6145}, share, 1.0)[0].allowed_mib == 6144
    assert watch.observe(NO_B_TOTAL, {(2, B): 9000}, share, 2.0)[0].used_mib == 6145  # unknown


def test_a_lease_using_a_gpu_it_does_not_hold_may_use_nothing_there() -> None:
    share = [LeaseShare(3, A, memory_mib=1000)]
    flags = OverLeaseWatch().observe(LISTED, {(3, A): 10, (3, B): 300}, share, 0.0)
    assert flags == [OverUse(3, B, 300, 0, 0.0, WARN, warn=True)]


def test_term_ends_the_lease_once_after_the_grace_and_nothing_else() -> None:
    watch = OverLeaseWatch(grace_s=10.0)
    shares = [LeaseShare(4, A, memory_mib=100, policy=TERM), LeaseShare(5, B, memory_mib=100)]
    use = {(4, A): 500, (5, B): 500}
    ends = [
        [(f.lease, f.end) for f in watch.observe(LISTED, use, shares, now)]
        for now in (0.0, 5.0, 9.9, 10.0, 12.0)
    ]
    assert ends == [[(4, False), (5, False)]] * 3 + [
        [(4, True), (5, False)],
        [(4, False), (5, False)],
    ]


def test_term_grace_restarts_when_the_lease_comes_back_within() -> None:
    watch = OverLeaseWatch(grace_s=10.0)
    share = [LeaseShare(4, A, memory_mib=100, policy=TERM)]
    watch.observe(LISTED, {(4, A): 500}, share, 0.0)
    watch.observe(LISTED, {(4, A): 50}, share, 8.0)
    assert not watch.observe(LISTED, {(4, A): 500}, share, 12.0)[0].end
    assert watch.observe(LISTED, {(4, A): 500}, share, 22.0)[0].end


def test_an_unknown_sample_keeps_the_flag_and_decides_nothing() -> None:
    watch = OverLeaseWatch(grace_s=10.0)
    share = [LeaseShare(4, A, memory_mib=100, policy=TERM)]
    watch.observe(LISTED, {(4, A): 500}, share, 0.0)
    unknown = watch.observe(LISTED, {(4, A): None}, share, 11.0)
    assert unknown == [OverUse(4, A, 500, 100, 0.0, TERM)]  # no warning, no end
    assert watch.observe(UNLISTED, {}, share, 12.0) == unknown  # A's process list unreadable
    assert watch.observe(Sample("nvml", ()), {}, share, 12.5) == unknown  # the whole sample
    assert watch.observe(LISTED, {(4, A): 500}, share, 13.0)[0].end


def test_a_lease_whose_processes_left_the_gpu_is_within_again() -> None:
    watch = OverLeaseWatch()
    share = [LeaseShare(4, A, memory_mib=100)]
    assert watch.observe(LISTED, {(4, A): 500}, share, 0.0)[0].warn
    assert watch.observe(LISTED, {}, share, 2.0) == []  # listed, and none of its processes
    assert watch.observe(LISTED, {(4, A): 500}, share, 4.0)[0].warn


def test_off_flags_without_saying_or_doing_anything() -> None:
    watch = OverLeaseWatch(grace_s=0.0)
    share = [LeaseShare(6, A, memory_mib=100, policy=OFF)]
    assert watch.observe(LISTED, {(6, A): 500}, share, 0.0) == [OverUse(6, A, 500, 100, 0.0, OFF)]


def test_a_gone_lease_is_forgotten() -> None:
    watch = OverLeaseWatch()
    watch.observe(LISTED, {(7, A): 500}, [LeaseShare(7, A, memory_mib=100)], 0.0)
    assert watch.observe(LISTED, {(7, A): 500}, [], 1.0) == []
    again = watch.observe(LISTED, {(7, A): 500}, [LeaseShare(7, A, memory_mib=100)], 2.0)
    assert again[0].warn and again[0].since == 2.0


@pytest.mark.parametrize("text", ["warn", "term", "off"])
def test_policies_parse_from_their_names(text: str) -> None:
    assert parse_policy(text).value == text
    assert parse_policy(OverLeasePolicy(text)) is OverLeasePolicy(text)
    assert LeaseShare(1, A, memory_mib=1, policy=text).policy is OverLeasePolicy(text)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("kill", ValueError, "over_lease must be one of 'warn', 'term', 'off', got 'kill'"),
        ("WARN", ValueError, "over_lease must be one of 'warn', 'term', 'off', got 'WARN'"),
        (None, TypeError, "over_lease must be one of 'warn', 'term', 'off', got None (NoneType)"),
    ],
)
def test_a_bad_policy_names_the_argument_and_value(
    value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        parse_policy(value)
    assert str(raised.value) == message


EXACTLY_ONE = "give memory_mib or fraction, exactly one (memory_mib=None, fraction=None)"
TOO_BIG = "fraction must be in (0, 1], got Fraction(3, 2)"
POLICIES = "one of 'warn', 'term', 'off'"


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({}, TypeError, EXACTLY_ONE),
        ({"memory_mib": 0}, ValueError, "memory_mib must be >= 1, got 0"),
        ({"fraction": Fraction(3, 2)}, ValueError, TOO_BIG),
        ({"memory_mib": 5, "policy": "kill"}, ValueError, f"policy must be {POLICIES}, got 'kill'"),
    ],
)  # fmt: skip
def test_a_bad_share_names_the_argument_and_value(
    arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        LeaseShare(1, A, **arguments)  # type: ignore[arg-type]
    assert str(raised.value) == message


@pytest.mark.parametrize("grace", [-1.0, float("inf"), float("nan")])
def test_a_bad_grace_names_the_argument(grace: float) -> None:
    with pytest.raises(ValueError, match="grace_s must"):
        OverLeaseWatch(grace_s=grace)
