"""A refused request is tried again later and later (1 s doubling to 5 min) and logged once
per change of reason, not once per try (it was re-sent every second, one log line each)."""

from __future__ import annotations

from hwpool._jobs._backoff import Backoff


def test_refusals_back_off_doubling_to_a_cap() -> None:
    backoff = Backoff(first_s=1.0, cap_s=300.0)
    delays = [backoff.refused("j1", "not a member").delay_s for _ in range(12)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(delays) == 300.0 and delays[-1] == 300.0


def test_a_refusal_is_logged_once_per_change_of_reason() -> None:
    backoff = Backoff()
    news = [backoff.refused("j1", reason).new for reason in ("a", "a", "a", "b", "b", "a")]
    assert news == [True, False, False, True, False, True]


def test_a_grant_or_a_dropped_job_starts_the_backoff_again() -> None:
    backoff = Backoff()
    for _ in range(5):
        backoff.refused("j1", "busy")
        backoff.refused("j2", "busy")
    backoff.forget("j1")
    again = backoff.refused("j1", "busy")
    assert again.delay_s == 1.0 and again.new
    backoff.keep({"j1"})
    dropped = backoff.refused("j2", "busy")  # j2 left the queue meanwhile: a fresh start
    assert (dropped.delay_s, dropped.new) == (1.0, True)
