"""The table's accounting fields: usage with each end, the GPUs held, who cancelled;
bad values refused, changing nothing."""

from __future__ import annotations

import math

import pytest
from jobtables import add, dump

from hwpool._jobs._model import JobState, Usage
from hwpool._jobs._store import JobStore


def test_each_end_records_the_usage_and_running_the_share(store: JobStore) -> None:
    used = Usage(1.5, 0.25, 2048)
    for end in ("finished", "timed_out", "cancelled"):
        job = add(store)
        store.mark_running(job.id, pid=4242, pid_start=1, gpu_share=0.25)
        code = {"exit_code": 0} if end == "finished" else {}
        ended = getattr(store, f"mark_{end}")(job.id, usage=used, **code)
        assert (ended.usage, ended.gpu_share) == (used, 0.25)


def test_a_cancel_noted_is_kept_by_the_launchers_record_and_cleared_by_an_own_end(
    store: JobStore,
) -> None:
    job = add(store)
    store.mark_running(job.id, pid=4242, pid_start=1)
    store.note_cancel(job.id, "alice")
    assert store.mark_cancelled(job.id).ended_by == "alice"
    other = add(store)
    store.mark_running(other.id, pid=4242, pid_start=1)
    store.note_cancel(other.id, "alice")
    assert store.mark_finished(other.id, exit_code=0).ended_by is None  # it ended first
    queued = add(store)
    assert store.mark_cancelled(queued.id, by="root").ended_by == "root"


@pytest.mark.parametrize(
    ("usage", "error"),
    [
        (Usage(-1.0, 0.0, 0), ValueError),
        (Usage(math.nan, 0.0, 0), ValueError),
        (Usage(0.0, 0.0, -5), ValueError),
        (Usage(0.0, "1", 0), TypeError),  # type: ignore[arg-type]
        ((1.0, 1.0, 1), TypeError),
    ],
)
def test_bad_usage_is_refused_and_changes_nothing(
    store: JobStore, usage: object, error: type[Exception]
) -> None:
    job = add(store)
    store.mark_running(job.id, pid=4242, pid_start=1)
    before = dump(store.path)
    with pytest.raises(error, match="usage"):
        store.mark_finished(job.id, exit_code=0, usage=usage)  # type: ignore[arg-type]
    assert dump(store.path) == before and store.get(job.id).state is JobState.RUNNING


@pytest.mark.parametrize(
    ("share", "error"), [(0, ValueError), (math.inf, ValueError), ("1", TypeError)]
)
def test_a_bad_share_is_refused(store: JobStore, share: object, error: type[Exception]) -> None:
    job = add(store)
    with pytest.raises(error, match="gpu_share"):
        store.mark_running(job.id, pid=4242, pid_start=1, gpu_share=share)  # type: ignore[arg-type]
    assert store.get(job.id).state is JobState.QUEUED
