"""Waiting for jobs, their exit statuses, and cancelling them: what ``hwpool wait`` and
``hwpool cancel jN`` do, and ``Job.wait()`` and ``Job.cancel()`` with them.

**Waiting is polling.** The supervisor and the launchers write the table from other
processes, and sqlite says when another connection committed (``PRAGMA data_version``), so a
waiter reads the table again only when it changed, every :data:`POLL_S`. A running job whose
launcher died without recording the end (it is no longer running, and the row still says
running) is recorded ``lost`` by whoever notices first; a racing writer that recorded the
end first wins (its JobStateError is expected).

**Cancelling** a queued or waiting job is a change in the table (the supervisor withdraws
its request when it next reads it; the jobs that depended on it are cancelled by
``ready()``, run here too so that ``hwpool jobs`` right after shows them). A running job is
ended by its launcher: it gets :data:`~._procs.CANCEL_SIGNAL`, ends the job's process group
(SIGTERM, SIGKILL after its grace) and records ``cancelled``; the canceller waits (bounded)
until the row says the job finished.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import _exits
from ._model import JobRecord, JobState, signal_name
from ._procs import CANCEL_SIGNAL, is_running, signal_if_running
from ._store import JobStateError, JobStore

__all__ = [
    "CANCELLED_STATUS",
    "CANCEL_WAIT_S",
    "LAUNCHER_CHECK_S",
    "LOST_STATUS",
    "POLL_S",
    "TIMED_OUT_STATUS",
    "CancelOutcome",
    "Watch",
    "cancel_job",
    "exit_status",
    "record_if_dead",
    "signal_name",
    "wait_for",
]

POLL_S = 0.05  # how often a waiter looks at the table
LAUNCHER_CHECK_S = 1.0  # how often it checks that the running jobs' launchers live
CANCEL_WAIT_S = 20.0  # how long cancelling a running job waits for its end to be recorded
TIMED_OUT_STATUS = _exits.TIMED_OUT  # 124, as timeout(1), and `hwpool run --time`
LOST_STATUS = _exits.LOST  # 123: the job's end is unknown: nothing watched it
CANCELLED_STATUS = _exits.CANCELLED  # 143: cancelled before it ran, or ended with a code
LAUNCHER_GONE = "its launcher was gone: the job's end was never recorded"


def exit_status(record: JobRecord) -> int:
    """The status ``hwpool wait`` exits with for the finished job ``record`` (see
    docs/jobs.md): 0 if it succeeded; a failed job's own code, or 128 + the signal that
    killed it; 124 if it timed out; 123 if it was lost; a cancelled job's 128 + the signal
    that ended it, else 143 (as if by SIGTERM)."""
    state = record.state
    if not state.finished:
        raise ValueError(f"{record.id} has not finished ({state.value}): it has no status yet")
    if state is JobState.SUCCEEDED:
        return 0
    if state is JobState.TIMED_OUT:
        return TIMED_OUT_STATUS
    if state is JobState.LOST:
        return LOST_STATUS
    if record.signal is not None:
        return 128 + record.signal
    if state is JobState.FAILED and record.exit_code is not None:
        return record.exit_code
    return CANCELLED_STATUS


def record_if_dead(store: JobStore, record: JobRecord, reason: str = LAUNCHER_GONE) -> JobRecord:
    """``record`` as it stands: a running job whose launcher is no longer running is
    recorded ``lost`` (unless another process recorded its end first)."""
    if record.state is not JobState.RUNNING or record.pid is None:
        return record
    if is_running(record.pid, record.pid_start):
        return record
    try:
        return store.mark_lost(record.id, reason=reason)
    except JobStateError:  # its end was recorded meanwhile (the launcher's last write)
        return store.get(record.id)


class Watch:
    """The records of some jobs, kept current: read again when another process committed a
    change to the table (``PRAGMA data_version``), and, once every :data:`LAUNCHER_CHECK_S`,
    a running job whose launcher died without recording its end is recorded lost (see
    :func:`record_if_dead`). Shared by ``wait`` and ``logs -f``."""

    def __init__(
        self,
        store: JobStore,
        records: Sequence[JobRecord],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.records = {record.id: record for record in records}
        self._clock = clock
        self._version = store.data_version()
        self._checked = clock()

    def pending(self) -> list[str]:
        """The ids of the jobs not finished yet, in the order given."""
        return [job_id for job_id, record in self.records.items() if not record.state.finished]

    def refresh(self) -> None:
        """Read the unfinished jobs again if the table changed; check their launchers when
        that is due."""
        version = self.store.data_version()
        if version != self._version:
            self._version = version
            for job_id in self.pending():
                self.records[job_id] = self.store.get(job_id)
        if self._clock() - self._checked >= LAUNCHER_CHECK_S:
            self._checked = self._clock()
            for job_id in self.pending():
                self.records[job_id] = record_if_dead(self.store, self.records[job_id])


def wait_for(
    store: JobStore,
    job_ids: Sequence[str],
    timeout: float | None = None,
    *,
    poll: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, JobRecord]:
    """The jobs ``job_ids`` once every one has finished, by id. UnknownJobError (before any
    wait) for an id the table lacks; TimeoutError naming those not finished when ``timeout``
    seconds pass first."""
    watch = Watch(store, [store.get(job_id) for job_id in job_ids], clock)
    deadline = None if timeout is None else clock() + timeout
    while pending := watch.pending():
        if deadline is not None and clock() >= deadline:
            raise TimeoutError(_not_finished(watch.records, pending, timeout))
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - clock())))
        watch.refresh()
    return watch.records


def _not_finished(records: dict[str, JobRecord], pending: Sequence[str], timeout: object) -> str:
    states = ", ".join(f"{job_id} is {records[job_id].state.value}" for job_id in pending)
    return f"not finished after {timeout} s: {states}"


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    """What cancelling a job did: ``record`` as it stands after; ``done`` whether the job
    is finished now; ``note`` says what happened, in words; ``dependents`` the jobs
    cancelled with it because they depended on it."""

    record: JobRecord
    done: bool
    note: str
    dependents: tuple[str, ...] = ()


def cancel_job(
    store: JobStore,
    job_id: str,
    *,
    wait_s: float = CANCEL_WAIT_S,
    poll: float = POLL_S,
    reason: str | None = None,
    by: str | None = None,
) -> CancelOutcome:
    """Cancel the job ``job_id`` (see the module); UnknownJobError for an unknown id.
    ``by``: who cancels it (a user's name, recorded as ``ended_by``).

    A finished job is left as it is (``done``, the note says so). A running job's launcher
    is signalled and the end awaited for up to ``wait_s`` seconds (not ``done`` if it was
    not recorded by then). ``reason``: a queued or waiting job's (default: the table's,
    ``cancelled by its user``)."""
    for _ in range(3):  # a queued job may start meanwhile: then it is cancelled as running
        record = store.get(job_id)
        if record.state.finished:
            return CancelOutcome(record, True, f"already {_ended(record)}: nothing to cancel")
        if record.state is JobState.RUNNING:
            if by is not None:
                with contextlib.suppress(JobStateError):  # it ended meanwhile
                    store.note_cancel(job_id, by)
            return _cancel_running(store, record, wait_s, poll)
        try:
            was = record.state.value
            if reason is None:
                cancelled = store.mark_cancelled(job_id, by=by)
            else:
                cancelled = store.mark_cancelled(job_id, reason=reason, by=by)
        except JobStateError:
            continue
        return CancelOutcome(cancelled, True, f"cancelled (it was {was})", _settle(store, job_id))
    record = store.get(job_id)
    return CancelOutcome(record, record.state.finished, f"is {record.state.value}")


def _settle(store: JobStore, cancelled: str) -> tuple[str, ...]:
    """Resolve the dependencies now (as the supervisor would), so that the jobs that waited
    on ``cancelled`` show cancelled at once; the ids of those it cancelled."""
    waiting = store.list(states=[JobState.WAITING.value])
    store.ready()
    after = {job.id: job for job in store.list(states=[JobState.CANCELLED.value])}
    return tuple(
        sorted(
            (job.id for job in waiting if job.id in after),
            key=lambda job_id: int(job_id[1:]),
        )
    )


def _cancel_running(
    store: JobStore, record: JobRecord, wait_s: float, poll: float
) -> CancelOutcome:
    """Signal the running job's launcher and wait (bounded) for the end it records."""
    assert record.pid is not None
    if not signal_if_running(record.pid, record.pid_start, CANCEL_SIGNAL):
        lost = record_if_dead(store, record)
        if lost.state is JobState.LOST:
            return CancelOutcome(lost, True, f"lost: {LAUNCHER_GONE}")
        return CancelOutcome(lost, lost.state.finished, f"already {_ended(lost)}")
    try:
        ended = wait_for(store, [record.id], wait_s, poll=poll)[record.id]
    except TimeoutError:
        current = store.get(record.id)
        return CancelOutcome(
            current, False,
            f"its launcher (pid {record.pid}) was told to cancel it, but has not recorded "
            f"its end within {wait_s:g} s",
        )  # fmt: skip
    if ended.state is JobState.CANCELLED:
        return CancelOutcome(ended, True, f"cancelled (it was running){_how(ended)}")
    return CancelOutcome(ended, True, f"{_ended(ended)} before it could be cancelled")


def _how(record: JobRecord) -> str:
    if record.signal is not None:
        return f", ended by {signal_name(record.signal)}"
    if record.exit_code is not None:
        return f", exited {record.exit_code}"
    return ""


def _ended(record: JobRecord) -> str:
    """``succeeded``, ``failed (exit 3)``, ``cancelled``, ... for a finished job."""
    if record.state is JobState.FAILED:
        code = signal_name(record.signal) if record.signal is not None else record.exit_code
        return f"failed ({'exit ' if record.signal is None else ''}{code})"
    return record.state.value
