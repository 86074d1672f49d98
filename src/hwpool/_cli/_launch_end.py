"""How a job's launcher records the job's end, also when the job table cannot be written.

The end (succeeded, failed, timed-out, cancelled, and why) is decided once, while the lease is
still held (whether the server ended it for overuse is the lease's to say), then written. A
write the table refuses for a fault of its own (``sqlite3.Error``: the disk is full, an I/O
error, a lock held past the busy timeout) is not the end of the record: the launcher releases
the lease (the job is over; its GPUs go on at once), says so, and writes again, 0.5 s later,
doubling to :data:`RETRY_CAP_S`, until the table takes it. While it tries, the job is still
``running`` in the table and its launcher alive, so the supervisor does not take it for lost.
Only after :data:`RECORD_FOR_S` of faults does it give up, with :data:`TABLE_FAULT` as its exit
status: the supervisor then records the job ``lost``, saying that its end could not be
recorded (an end that is not known is never written as one that is).
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._gpu._lease import GPULease
from .._jobs._faults import TABLE_FAULT
from .._jobs._model import JobRecord, JobState, Usage
from .._jobs._store import JobStateError, JobStore
from . import _child

__all__ = ["RECORD_FOR_S", "TABLE_FAULT", "Outcome", "outcome_of", "record"]

RECORD_FOR_S = 24 * 3600.0  # how long a launcher tries to record its job's end
RETRY_FIRST_S = 0.5
RETRY_CAP_S = 10.0


@dataclass(frozen=True)
class Outcome:
    """What to write: the store's transition (``mark_finished``, ...) and its arguments."""

    method: str
    arguments: dict[str, Any] = field(default_factory=dict)


def outcome_of(
    end: _child.JobEnd, cancelled: bool, lease: GPULease, usage: Usage | None = None
) -> Outcome:
    """How the job ended, as the table is to record it (``cancelled``: ``hwpool cancel``
    asked for it; ``lease``: still held, to ask whether the server ended it for overuse;
    ``usage``: what its process tree used, recorded with its end)."""
    code: dict[str, Any] = (
        {"signal": -end.returncode} if end.returncode < 0 else {"exit_code": end.returncode}
    )
    code["usage"] = usage
    if end.timed_out:
        return Outcome("mark_timed_out", {"signal": code.get("signal"), "usage": usage})
    if end.ended and cancelled:
        return Outcome("mark_cancelled", code)
    if _child.ended_for_overuse(lease, sync=end.ended or end.returncode < 0):
        why = "ended for overuse: it used more GPU memory than it was leased"
        return Outcome("mark_cancelled", {"reason": why, **code})
    if end.ended:
        why = "its lease was revoked (hwpool cancel, or lost with the server)"
        return Outcome("mark_cancelled", {"reason": why, **code})
    return Outcome("mark_finished", code)


def record(
    store: JobStore,
    job: JobRecord,
    outcome: Outcome,
    release: Callable[[], None],
    *,
    record_for_s: float = RECORD_FOR_S,
) -> int:
    """Write ``outcome`` for ``job``; the launcher's exit status: 0 once written (whatever
    the job's status), :data:`TABLE_FAULT` when the table refused it for ``record_for_s``.
    ``release`` gives the lease back; it is called at the first refusal (the caller releases
    it too, after: releasing is idempotent)."""
    delay, deadline = RETRY_FIRST_S, time.monotonic() + record_for_s
    while True:
        try:
            _write(store, job.id, outcome)
            break
        except sqlite3.Error as exc:
            if delay == RETRY_FIRST_S:
                release()
                _child.say(f"hwpool: cannot record how {job.id} ended ({_end_words(outcome)}): "
                           f"the job table refused it ({exc}); its lease is released, and the "
                           "record is written again until the table takes it")  # fmt: skip
            if time.monotonic() + delay > deadline:
                _child.say(f"hwpool: gave up recording how {job.id} ended: {exc}")
                return TABLE_FAULT
            time.sleep(delay)  # a backoff: nothing wakes a launcher when the disk frees
            delay = min(delay * 2, RETRY_CAP_S)
    with contextlib.suppress(sqlite3.Error):  # a line for the user; the record is written
        finished = store.get(job.id)
        _child.say(f"hwpool: {job.id} {finished.state.value}" + _how(finished))
    return 0


def _write(store: JobStore, job_id: str, outcome: Outcome) -> None:
    with contextlib.suppress(JobStateError):  # someone recorded it first (a lost job)
        getattr(store, outcome.method)(job_id, **outcome.arguments)


def _end_words(outcome: Outcome) -> str:
    """``mark_finished exit_code=0``: the record that waits, for the launcher's message."""
    words = " ".join(f"{key}={value}" for key, value in outcome.arguments.items() if key != "usage")
    return f"{outcome.method} {words}".strip()


def _how(job: JobRecord) -> str:
    if job.signal is not None:
        return f" (killed by {signal.Signals(job.signal).name})"
    if job.exit_code is not None and job.state is not JobState.SUCCEEDED:
        return f" (exit status {job.exit_code})"
    return ""
