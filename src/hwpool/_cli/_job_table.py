"""The caller's job table as the job commands open it: its directory (bad usage for a
malformed ``HWPOOL_STATE_DIR``), the table itself, a table error in one line, and cancelling
jobs in it: ``hwpool cancel jN`` goes through :func:`cancel_jobs` whichever way the parser
sends it (job ids alone, mixed with server ids, or ``--user`` as root)."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .._jobs._control import CancelOutcome, cancel_job
from .._jobs._handle import open_table, wake_supervisor
from .._jobs._schema import JobTableError
from .._jobs._state import state_directory
from .._jobs._store import JobStateError, JobStore, UnknownJobError
from .._jobs._submit import user_name
from .._wire._safety import UnsafePathError
from ._text import one_line, plural

__all__ = [
    "CancelRefused",
    "JobUsageError",
    "cancel_jobs",
    "expanded",
    "job_directory",
    "job_table",
    "one_line_message",
]


class JobUsageError(Exception):
    """Bad usage or input: one line on stderr, exit status 2."""


def one_line_message(exc: BaseException) -> str:
    """The error's text in one line, the table's argument name (``job_id``) as the
    command's (``ID``)."""
    text = str(exc.args[0]) if isinstance(exc, LookupError) and exc.args else str(exc)
    if text.startswith("job_id"):
        text = "ID" + text.removeprefix("job_id")
    return one_line(text)


def job_directory() -> Path:
    """The caller's state directory; bad usage for a malformed ``HWPOOL_STATE_DIR``."""
    try:
        return state_directory()
    except ValueError as exc:
        raise JobUsageError(str(exc)) from None


@contextmanager
def job_table(job_ids: Sequence[str] = ()) -> Iterator[JobStore]:
    """The caller's job table; an unknown-job error naming ``job_ids`` when there is none."""
    directory = job_directory()
    store = open_table(directory)
    if store is None:
        named = ", ".join(repr(job_id) for job_id in job_ids) or "any job"
        raise UnknownJobError(
            f"ID: no job {named}: you have no job table yet ({str(directory)!r}; "
            "`hwpool submit` makes it)"
        )
    with store:
        yield store


def expanded(store: JobStore, job_ids: Sequence[str]) -> dict[str, bool]:
    """The jobs ``job_ids`` stand for, in order, each once (an array's id: its members),
    each with whether it was named itself (not through its array); UnknownJobError for an
    unknown one."""
    found: dict[str, bool] = {}
    for job_id in job_ids:
        members = store.members(job_id)
        for member in members:
            found[member] = found.get(member, False) or members == [job_id]
    return found


def cancel_jobs(job_ids: Sequence[str], reason: str | None = None, by: str | None = None) -> int:
    """``hwpool cancel jN...``: cancel each job, one line each on what happened; the number
    not cancelled (not confirmed within the wait). Exit-2 errors (an unknown id: then none is
    cancelled) are raised as :class:`CancelRefused` for ``hwpool cancel`` to report. ``reason``:
    a queued job's (root's ``cancel --user``: ``cancelled by root``); ``by``: who cancels
    (default: this process's user). An array's id cancels its members."""
    try:
        with job_table(job_ids) as store:
            job_ids = list(expanded(store, job_ids))  # every id known before any is cancelled
            who = user_name() if by is None else by
            outcomes = [cancel_job(store, job_id, reason=reason, by=who) for job_id in job_ids]
    except (UnknownJobError, JobStateError) as exc:
        raise CancelRefused(one_line_message(exc), 2) from None
    except (UnsafePathError, JobTableError) as exc:
        raise CancelRefused(one_line_message(exc), 1) from None
    except OSError as exc:  # a folder or file closed to this user, say
        raise CancelRefused(f"cannot read {exc.filename!r}: {exc.strerror}", 1) from None
    wake_supervisor(job_directory())
    unconfirmed = 0
    for outcome in outcomes:
        print(_cancel_line(outcome), file=sys.stdout if outcome.done else sys.stderr)
        unconfirmed += not outcome.done
    return unconfirmed


class CancelRefused(Exception):
    """``hwpool cancel jN`` refused before cancelling anything: the message and status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _cancel_line(outcome: CancelOutcome) -> str:
    line = f"{outcome.record.id}: {outcome.note}"
    if outcome.dependents:
        line += f"; with it {plural(len(outcome.dependents), 'job')} that depended on it: "
        line += ", ".join(outcome.dependents)
    return line if outcome.done else f"hwpool: error: {line}"
