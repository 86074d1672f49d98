"""Dependency kinds (``after``, ``after_any``, ``after_notok``) and holds, on a real table:
the verdict for every way a dependency can end, the refusals at add, and what ``ready()``
offers the supervisor."""

from __future__ import annotations

import pytest
from jobtables import add, dump

from hwpool._jobs._depends import Dependency, DependencyKind, verdict
from hwpool._jobs._model import JobRecord, JobState
from hwpool._jobs._store import JobStateError, JobStore


def ended(store: JobStore, how: str) -> JobRecord:
    """A job that ended ``how``: succeeded, failed, cancelled, timed-out or lost."""
    job = add(store)
    if how == "cancelled":
        return store.mark_cancelled(job.id)
    store.mark_running(job.id, pid=4242, pid_start=1)
    if how == "succeeded":
        return store.mark_finished(job.id, exit_code=0)
    if how == "failed":
        return store.mark_finished(job.id, exit_code=3)
    if how == "timed-out":
        return store.mark_timed_out(job.id)
    return store.mark_lost(job.id, reason="gone")


ENDS = ["succeeded", "failed", "cancelled", "timed-out", "lost"]


@pytest.mark.parametrize("how", ENDS)
def test_after_any_runs_after_every_end(store: JobStore, how: str) -> None:
    first = add(store)
    job = add(store, after_any=[first.id])
    assert job.state is JobState.WAITING and job.after_any == (first.id,) and job.after == ()
    store.mark_cancelled(first.id) if how == "cancelled" else _end(store, first.id, how)
    assert [queued.id for queued in store.ready()] == [job.id]


@pytest.mark.parametrize("how", ENDS)
def test_after_notok_runs_only_if_it_did_not_succeed(store: JobStore, how: str) -> None:
    first = add(store)
    job = add(store, after_notok=[first.id])
    store.mark_cancelled(first.id) if how == "cancelled" else _end(store, first.id, how)
    ready = [queued.id for queued in store.ready()]
    if how == "succeeded":
        assert ready == []
        cancelled = store.get(job.id)
        assert cancelled.state is JobState.CANCELLED
        assert cancelled.reason == (
            f"dependency {first.id} succeeded (--after-notok needs one to fail)"
        )
    else:
        assert ready == [job.id]


def test_after_notok_of_several_runs_once_one_fails_and_the_rest_may_run(
    store: JobStore,
) -> None:
    a, b = add(store), add(store)
    job = add(store, after_notok=[a.id, b.id])
    _end(store, a.id, "succeeded")
    assert job.id not in _ids(store.ready()) and store.get(job.id).state is JobState.WAITING
    _end(store, b.id, "failed")
    assert _ids(store.ready()) == [job.id]


def test_kinds_mix_and_the_first_that_cannot_be_met_names_the_reason(store: JobStore) -> None:
    ok, anything, notok = add(store), add(store), add(store)
    job = add(store, after=[ok.id], after_any=[anything.id], after_notok=[notok.id])
    assert (job.after, job.after_any, job.after_notok) == ((ok.id,), (anything.id,), (notok.id,))
    _end(store, anything.id, "failed")
    _end(store, notok.id, "failed")
    assert _ids(store.ready()) == [ok.id]  # which still runs: the job waits for it
    _end(store, ok.id, "failed")
    store.ready()
    assert store.get(job.id).reason == f"dependency {ok.id} failed (exit 3)"


def test_a_dependency_that_can_never_be_met_is_refused_at_add(store: JobStore) -> None:
    done = ended(store, "succeeded")
    before = dump(store.path)
    with pytest.raises(ValueError, match=r"after_notok: dependency j1 succeeded .* never run"):
        add(store, after_notok=[done.id])
    with pytest.raises(ValueError, match=r"after_any: no job 'j9'"):
        add(store, after_any=["j9"])
    with pytest.raises(ValueError, match=r"after_any\[0\] must be a job id"):
        add(store, after_any=["9"])
    with pytest.raises(ValueError, match=r"after_notok: 'j1' is already a dependency \(after\)"):
        add(store, after=[done.id], after_notok=[done.id])
    assert dump(store.path) == before


def test_an_ended_dependency_of_a_kind_it_satisfies_queues_at_once(store: JobStore) -> None:
    failed = ended(store, "failed")
    assert add(store, after_any=[failed.id]).state is JobState.QUEUED
    assert add(store, after_notok=[failed.id]).state is JobState.QUEUED


def test_a_retry_keeps_each_kind(store: JobStore) -> None:
    failed = ended(store, "failed")
    cleanup = add(store, after_notok=[failed.id], after_any=[])
    store.mark_running(cleanup.id, pid=1, pid_start=1)
    store.mark_finished(cleanup.id, exit_code=1)
    again = store.retry(cleanup.id)
    assert (again.after_notok, again.state) == ((failed.id,), JobState.QUEUED)


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        ((), (True, None)),
        (((DependencyKind.OK, JobState.RUNNING),), (False, None)),
        (((DependencyKind.OK, None),), (False, "dependency j1 was pruned")),
        (((DependencyKind.ANY, None),), (True, None)),
        (
            ((DependencyKind.NOTOK, None),),
            (False, "dependency j1 was pruned (--after-notok needs one to fail)"),
        ),
        (
            ((DependencyKind.NOTOK, JobState.LOST), (DependencyKind.NOTOK, JobState.RUNNING)),
            (True, None),
        ),
        (
            ((DependencyKind.ANY, JobState.QUEUED), (DependencyKind.NOTOK, JobState.FAILED)),
            (False, None),
        ),
    ],
)
def test_the_verdict_on_each_case(
    kinds: tuple[tuple[DependencyKind, JobState | None], ...], expected: tuple[bool, str | None]
) -> None:
    deps = [Dependency(i + 1, kind, state, None, None) for i, (kind, state) in enumerate(kinds)]
    assert tuple(verdict(deps)) == expected


# ----------------------------------------------------------------- holds
def test_a_held_job_is_not_offered_until_released_and_keeps_its_id(store: JobStore) -> None:
    first, second = add(store), add(store)
    held = store.hold(first.id, "alice")
    assert (held.held_by, held.state, held.shown_state) == ("alice", JobState.QUEUED, "held")
    assert [job.id for job in store.ready()] == [second.id]
    assert store.release_hold(first.id).held_by is None
    assert [job.id for job in store.ready()] == [first.id, second.id]


def test_a_waiting_job_held_stays_held_once_its_dependency_succeeds(store: JobStore) -> None:
    first = add(store)
    job = add(store, after=[first.id])
    store.hold(job.id, "alice")
    _end(store, first.id, "succeeded")
    assert store.ready() == []
    assert store.get(job.id).state is JobState.QUEUED and store.get(job.id).held
    store.release_hold(job.id)
    assert [queued.id for queued in store.ready()] == [job.id]


def test_submitted_held(store: JobStore) -> None:
    job = add(store, held_by="bob")
    assert job.held_by == "bob" and store.ready() == []


@pytest.mark.parametrize("how", ["running", "succeeded", "cancelled"])
def test_holding_a_job_that_is_not_queued_is_refused_and_changes_nothing(
    store: JobStore, how: str
) -> None:
    job = add(store)
    if how == "cancelled":
        store.mark_cancelled(job.id)
    else:
        store.mark_running(job.id, pid=4242, pid_start=1)
        if how == "succeeded":
            store.mark_finished(job.id, exit_code=0)
    before = dump(store.path)
    with pytest.raises(JobStateError, match=rf"'{job.id}' is {how}: hold needs a job that is"):
        store.hold(job.id, "alice")
    with pytest.raises(JobStateError, match=rf"'{job.id}' is {how}: release needs"):
        store.release_hold(job.id)
    assert dump(store.path) == before


@pytest.mark.parametrize(
    ("holder", "error"), [("", ValueError), ("a\nb", ValueError), (3, TypeError)]
)
def test_a_bad_holder_is_refused(store: JobStore, holder: object, error: type[Exception]) -> None:
    job = add(store)
    with pytest.raises(error, match="held_by must be a user's name"):
        store.hold(job.id, holder)  # type: ignore[arg-type]
    assert store.get(job.id).held_by is None


def _ids(jobs: list[JobRecord]) -> list[str]:
    return [job.id for job in jobs]


def _end(store: JobStore, job_id: str, how: str) -> None:
    store.mark_running(job_id, pid=4242, pid_start=1)
    if how == "succeeded":
        store.mark_finished(job_id, exit_code=0)
    elif how == "failed":
        store.mark_finished(job_id, exit_code=3)
    elif how == "timed-out":
        store.mark_timed_out(job_id)
    else:
        store.mark_lost(job_id, reason="gone")


def test_a_held_job_cancelled_is_no_longer_held(store: JobStore) -> None:
    job = add(store, held_by="alice")
    cancelled = store.mark_cancelled(job.id, by="root")
    assert (cancelled.held, cancelled.held_by, cancelled.shown_state) == (False, None, "cancelled")
