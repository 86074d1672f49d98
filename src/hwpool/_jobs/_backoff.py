"""When to ask the host server again for a job whose request it refused, and whether to say so.

A refusal that may pass (the server is full of its limits, the user is not yet a member, the
server restarts) is tried again later and later: 1 s, doubling, to at most 5 minutes, so a
refusal that lasts costs a few requests an hour, not one a second. The supervisor logs a
refusal only when its reason changed since the job's last one (one line per change, not per
try: a log that grew by a line a second filled the disk). A grant, or the job leaving the
queue, starts the job's backoff again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["Backoff", "Refusal"]

FIRST_S = 1.0
CAP_S = 300.0


@dataclass(frozen=True)
class Refusal:
    """What to do after one refusal: wait ``delay_s``; log it when ``new`` (its reason
    differs from the job's last one)."""

    delay_s: float
    new: bool


class Backoff:
    """Each job's backoff: its last reason and its next delay."""

    def __init__(self, first_s: float = FIRST_S, cap_s: float = CAP_S) -> None:
        if not 0 < first_s <= cap_s:
            raise ValueError(f"first_s must be > 0 and <= cap_s, got {first_s!r} and {cap_s!r}")
        self._first_s, self._cap_s = first_s, cap_s
        self._jobs: dict[str, tuple[str, float]] = {}  # job -> (last reason, last delay)

    def refused(self, job_id: str, reason: str) -> Refusal:
        """Note that ``job_id``'s request was refused for ``reason``: how long to wait."""
        last = self._jobs.get(job_id)
        delay = self._first_s if last is None else min(last[1] * 2, self._cap_s)
        self._jobs[job_id] = (reason, delay)
        return Refusal(delay, last is None or last[0] != reason)

    def forget(self, job_id: str) -> None:
        """``job_id`` got its share (or was given up): its next refusal starts afresh."""
        self._jobs.pop(job_id, None)

    def keep(self, job_ids: Collection[str]) -> None:
        """Forget every job not in ``job_ids`` (the ones still queued)."""
        for job_id in [job for job in self._jobs if job not in job_ids]:
            del self._jobs[job_id]
