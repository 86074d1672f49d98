"""``JobStore.update``: a queued or waiting job edited in place; everything else refused,
changing nothing."""

from __future__ import annotations

from fractions import Fraction

import pytest
from jobtables import add, dump

from hwpool._jobs._model import JobState
from hwpool._jobs._store import JobStateError, JobStore


def test_each_field_changes_in_place(store: JobStore) -> None:
    job = add(store, gpus=0.5, priority=1, time_limit=60)
    edited = store.update(job.id, name="renamed", priority=-3, time_limit=7200, gpus=2)
    assert (edited.id, edited.name, edited.priority, edited.time_limit) == (
        job.id, "renamed", -3, 7200,
    )  # fmt: skip
    assert (edited.gpus, edited.memory_mib, edited.state) == (2, None, JobState.QUEUED)
    memory = store.update(job.id, memory_mib=20_000)
    assert (memory.gpus, memory.memory_mib) == (None, 20_000)
    back = store.update(job.id, gpus=Fraction(1, 4))
    assert (back.gpus, back.memory_mib, back.name) == (Fraction(1, 4), None, "renamed")


def test_a_waiting_job_can_be_edited(store: JobStore) -> None:
    first = add(store)
    job = add(store, after=[first.id])
    assert store.update(job.id, priority=5).state is JobState.WAITING


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({}, ValueError, "give at least one"),
        ({"priority": 10**9}, ValueError, "priority"),
        ({"time_limit": 0}, ValueError, "time_limit"),
        ({"gpus": 1.5}, ValueError, "gpus must be a fraction"),
        ({"gpus": 0.5, "memory_mib": 10}, ValueError, "not both"),
        ({"name": ""}, ValueError, "name"),
        ({"priority": "high"}, TypeError, "priority"),
    ],
)
def test_bad_values_are_refused_and_change_nothing(
    store: JobStore, fields: dict[str, object], error: type[Exception], match: str
) -> None:
    job = add(store)
    before = dump(store.path)
    with pytest.raises(error, match=match):
        store.update(job.id, **fields)  # type: ignore[arg-type]
    assert dump(store.path) == before


def test_a_running_or_finished_job_cannot_be_edited(store: JobStore) -> None:
    job = add(store)
    store.mark_running(job.id, pid=4242, pid_start=1)
    before = dump(store.path)
    with pytest.raises(JobStateError, match=r"'j1' is running: update needs a job that is"):
        store.update(job.id, priority=1)
    assert dump(store.path) == before
    store.mark_finished(job.id, exit_code=0)
    with pytest.raises(JobStateError, match=r"'j1' is succeeded: update needs"):
        store.update(job.id, priority=1)
    assert store.get(job.id).priority == 0
