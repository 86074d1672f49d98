"""Why each unfinished job of ``hwpool jobs`` waits, and when it should start (issue 37).

A held job waits ``held``, one whose dependencies have not succeeded ``dependency`` (the jobs
layer knows both); a queued job's request waits at the host server, which says why and when
(its waiter labelled with the job's id). The server is asked once, and only when some job is
queued; a server that cannot be reached leaves those unknown.
"""

from __future__ import annotations

import pwd
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from .._jobs._model import JobRecord, JobState

if TYPE_CHECKING:
    from .._wire._protocol import WaiterRecord

HELD = "held"
DEPENDENCY = "dependency"
"""The reasons the jobs layer knows itself (``hwpool._core._explain.Reason``'s values: the
core and the protocol are loaded only when a queued job's server is asked)."""

__all__ = ["JobWait", "job_waits", "wait_json"]


class JobWait(NamedTuple):
    """Why a job waits (a :class:`~hwpool._core._explain.Reason` value), in words, and its
    estimated start (wall clock; None: unknown)."""

    reason: str
    detail: str
    estimated_start: float | None


def job_waits(rows: Sequence[tuple[str, JobRecord]]) -> dict[tuple[str, str], JobWait]:
    """By (user, job id), why each held, waiting or queued job of ``rows`` waits."""
    found: dict[tuple[str, str], JobWait] = {}
    queued: list[tuple[str, JobRecord]] = []
    for user, job in rows:
        if job.held:
            found[user, job.id] = JobWait(HELD, f"held by {job.held_by}", None)
        elif job.state is JobState.WAITING:
            after = ", ".join((*job.after, *job.after_any, *job.after_notok))
            found[user, job.id] = JobWait(DEPENDENCY, f"after {after}", None)
        elif job.state is JobState.QUEUED:
            queued.append((user, job))
    if queued:
        waiters = _server_waiters()
        for user, job in queued:
            record = waiters.get((user, job.id))
            if record is not None and record.reason is not None:
                found[user, job.id] = JobWait(
                    record.reason, record.reason_detail or "", record.estimated_start
                )
    return found


def wait_json(wait: JobWait | None) -> dict[str, object]:
    """The fields ``hwpool jobs --json`` adds to a job's record: why it waits, in words, and
    its estimated start (all None for a job that does not wait, or where nobody says)."""
    return {
        "wait_reason": None if wait is None else wait.reason,
        "wait_detail": None if wait is None else wait.detail,
        "estimated_start": None if wait is None else wait.estimated_start,
    }


def _server_waiters() -> dict[tuple[str, str], WaiterRecord]:
    """The host server's waiters labelled with a job id, by (user, job id); none if no
    server answers."""
    from .._wire._connection import Wire  # noqa: PLC0415  (only when a job is queued)
    from .._wire._paths import client_socket  # noqa: PLC0415

    try:
        path = client_socket().path
        if not path.exists():
            return {}
        wire = Wire(path, role="control")
    except (OSError, ValueError, ConnectionError):
        return {}
    try:
        reply = wire.status()
    except (OSError, ConnectionError):
        return {}
    finally:
        wire.shutdown()
    return {(_user(w.uid), (w.name or "").split(" ", 1)[0]): w for w in reply.waiting if w.name}


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
