"""A job's record as JSON (``hwpool jobs --json``, a notifier's stdin): every field but the
environment, which holds secrets; and the durations both the JSON and the table show."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ._model import JobRecord, signal_name

__all__ = ["exit_text", "job_json", "ran_s", "waited_s"]


def job_json(job: JobRecord, user: str, now: float) -> dict[str, Any]:
    """One job as ``hwpool jobs --json`` prints it (see docs/jobs.md for the schema). The
    environment is left out: it holds secrets."""
    return {
        "id": job.id, "user": user, "name": job.name, "argv": list(job.argv), "cwd": job.cwd,
        "state": job.shown_state, "finished": job.state.finished, "held_by": job.held_by,
        "exit_code": job.exit_code, "signal": job.signal,
        "signal_name": None if job.signal is None else signal_name(job.signal),
        "exit": exit_text(job) or None,
        "gpus": None if job.gpus is None else float(job.gpus),
        "gpus_exact": None if job.gpus is None else str(job.gpus),
        "memory_mib": job.memory_mib, "priority": job.priority,
        "time_limit_s": job.time_limit, "after": list(job.after),
        "after_any": list(job.after_any), "after_notok": list(job.after_notok),
        "gpu_ids": list(job.gpu_ids), "lease": job.lease, "pid": job.pid,
        "queued_at": job.queued_at, "queued_at_iso": _iso(job.queued_at),
        "started_at": job.started_at, "started_at_iso": _iso(job.started_at),
        "ended_at": job.ended_at, "ended_at_iso": _iso(job.ended_at),
        "waited_s": waited_s(job, now), "ran_s": ran_s(job, now),
        "reason": job.reason, "stdout_log": job.stdout_log, "stderr_log": job.stderr_log,
        "retry_of": job.retry_of, "array_id": job.array_id, "array_index": job.array_index,
        **_accounting(job, now),
    }  # fmt: skip


def _accounting(job: JobRecord, now: float) -> dict[str, Any]:
    """What the job used (docs/jobs.md, Accounting): GPU-seconds are the GPUs it held times
    its run time; CPU time and peak RSS are its launcher's ``getrusage`` of the job's
    process tree, known once it ended. The watcher's peak GPU memory is not recorded yet."""
    ran = ran_s(job, now)
    usage = job.usage
    return {
        "gpu_share": job.gpu_share,
        "gpu_seconds": None if job.gpu_share is None or ran is None else job.gpu_share * ran,
        "cpu_user_s": None if usage is None else usage.cpu_user_s,
        "cpu_system_s": None if usage is None else usage.cpu_system_s,
        "max_rss_kib": None if usage is None else usage.max_rss_kib,
        "peak_gpu_memory_mib": None,
        "ended_by": job.ended_by,
        "notify": job.notify is not None,
    }


def _iso(stamp: float | None) -> str | None:
    """``2026-12-04T17:03:12.250000+00:00``: the time in UTC, ISO 8601."""
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).isoformat()


def waited_s(job: JobRecord, now: float) -> float:
    """Seconds between queueing and starting (until now, or the end, if it has not started)."""
    until = job.started_at if job.started_at is not None else (job.ended_at or now)
    return max(0.0, until - job.queued_at)


def ran_s(job: JobRecord, now: float) -> float | None:
    """Seconds it ran (so far, for a running job); None if it never started."""
    if job.started_at is None:
        return None
    return max(0.0, (job.ended_at or now) - job.started_at)


def exit_text(job: JobRecord) -> str:
    """``3``, ``SIGKILL``, or nothing (not finished, or no exit known)."""
    if job.signal is not None:
        return signal_name(job.signal)
    return "" if job.exit_code is None else str(job.exit_code)
