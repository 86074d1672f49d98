"""A job's launcher: the process that holds one job's lease, runs the job and records its end.

The supervisor starts it (in a session of its own) when the job's share is granted, and
writes on its stdin one line of JSON: the job's id, the lease's id, the hand-over ticket and
the server's socket. The launcher then:

1. takes the lease over (``GPUPool.take_over``): from here the lease is this process's,
   kept if the supervisor dies, reclaimed after a restart of the host server, and freed
   by the server if this process dies;
2. records the job ``running`` with its own pid and start time: the table's ``queued ->
   running`` transition is the one place that decides who runs a job, so if the job was
   cancelled meanwhile, or another launcher won, it gives the lease back and exits;
3. runs the job as ``hwpool run`` does (its own process group, killed if this process is
   killed) with the job's environment and working directory plus the lease's variables,
   stdin from ``/dev/null``, stdout and stderr through pipes copied into ``logs/<id>.out``
   and ``logs/<id>.err`` up to ``HWPOOL_JOBS_LOG_MAX`` each (``_jobs._capped``: a marker
   where output was dropped; a log is only ever appended to, never truncated);
   ends it at its time limit, counted from the lease's grant as the server counts it (one
   clock: a launcher that starts late does not stretch it; SIGTERM, SIGKILL after the
   grace), or when ``hwpool cancel``
   sends :data:`~hwpool._jobs._procs.CANCEL_SIGNAL`, or when the lease is revoked;
4. records the end (succeeded, failed, timed-out, cancelled) and releases the lease; a table
   that cannot be written (the disk is full) is written again until it takes the record
   (``_launch_end``). Before the job starts, such a fault leaves the job queued and ends
   the launcher with exit status :data:`~._launch_end.TABLE_FAULT`, for the supervisor.

Its own messages go to the job's stderr log, where the user looks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from .. import _exits
from .._gpu._lease import GPULease
from .._gpu._pool import GPUPool
from .._jobs._capped import LogCopy
from .._jobs._model import JobRecord, Usage
from .._jobs._procs import CANCEL_SIGNAL, process_start
from .._jobs._state import log_cap_from_env
from .._jobs._store import JobStateError, JobStore
from .._jobs._supervisor import GRACE_S
from .._wire._safety import UnsafePathError, open_side_file
from . import _autostart, _child
from ._launch_end import TABLE_FAULT, outcome_of, record

__all__ = ["main"]

LOGS = "logs"
JOB_ID_VAR = "HWPOOL_JOB_ID"
ARRAY_ID_VAR = "HWPOOL_ARRAY_ID"
ARRAY_INDEX_VAR = "HWPOOL_ARRAY_INDEX"


class _Cancel:
    """Set by CANCEL_SIGNAL: the job is to be ended and recorded as cancelled."""

    requested = False

    @classmethod
    def handle(cls, signum: int, frame: FrameType | None) -> None:
        cls.requested = True


def main(argv: Sequence[str] | None = None) -> int:
    """``DIR`` (the state directory), with the hand-over on stdin (see the module)."""
    signal.signal(CANCEL_SIGNAL, _Cancel.handle)  # first: the default action would kill us
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        handoff = json.loads(sys.stdin.readline())
        _stdin_from_devnull()
        return _launch(Path(args[0]), handoff)
    except sqlite3.Error as exc:  # before the job started: it stays queued
        _child.say(f"hwpool launcher: cannot start the job: the job table: {exc}")
        return TABLE_FAULT
    except Exception as exc:
        _child.say(f"hwpool launcher: cannot start the job: {type(exc).__name__}: {exc}")
        return 3


def _launch(directory: Path, handoff: dict[str, Any]) -> int:
    with JobStore.open(directory) as store:
        job = store.get(str(handoff["job"]))
        backend = _autostart.connect(
            Path(handoff["socket"]), autostart=False, name=f"{job.id} {job.name}",
            command=f"launcher of {job.id}",
        )  # fmt: skip
        try:
            pool = GPUPool(backend=backend)
            lease = _take_over(store, job, pool, handoff)
            try:
                return _run(store, directory, job, pool, lease)
            finally:
                lease.__exit__(None, None, None)
        finally:
            backend.close()


def _take_over(store: JobStore, job: JobRecord, pool: GPUPool, handoff: dict[str, Any]) -> GPULease:
    """The job's lease, taken over; a refusal (the offer is gone: the supervisor died, or it
    was not taken in time) is noted on the job's record, which stays queued, and raised."""
    try:
        return pool.take_over(int(handoff["lease"]), str(handoff["ticket"]))
    except (ValueError, ConnectionError) as exc:
        note = f"its launcher could not take its lease over ({exc}): queued again"
        with contextlib.suppress(JobStateError, sqlite3.Error):  # cancelled meanwhile
            store.note_queued(job.id, note)
        raise


def _run(store: JobStore, directory: Path, job: JobRecord, pool: GPUPool, lease: GPULease) -> int:
    out, err = _log_paths(directory, job)
    fds = [_open_log(out), _open_log(err)]
    try:
        try:
            store.mark_running(
                job.id, pid=os.getpid(), pid_start=process_start(os.getpid()) or 0,
                gpu_ids=lease.devices, lease=lease.id, stdout_log=str(out), stderr_log=str(err),
                gpu_share=lease.fraction * len(lease.gpus) or None,
            )  # fmt: skip
        except JobStateError:
            return 0  # cancelled meanwhile, or another launcher runs it: the lease goes back
        except sqlite3.Error as exc:  # the disk is full, say: the job stays queued
            _child.say(f"hwpool launcher: cannot record {job.id} running ({exc}): not "
                       "starting it; its lease goes back")  # fmt: skip
            return TABLE_FAULT
        os.dup2(fds[1], 2)  # our own lines go where the user reads the job's
        copy = LogCopy((fds[0], fds[1]), *log_cap_from_env(os.environ))
        try:
            end = _execute(job, lease, list(copy.job_fds), pool)
        finally:
            copy.finish()
        outcome = outcome_of(end, _Cancel.requested, lease, _usage_of_the_job())
        return record(store, job, outcome, lambda: lease.__exit__(None, None, None))
    finally:
        for fd in fds:
            os.close(fd)


def _usage_of_the_job() -> Usage | None:
    """What the job's process tree used: the launcher's waited-for children are the job and
    what it waited for (Linux counts ``ru_maxrss`` in KiB); None where there is no
    ``getrusage``."""
    try:
        import resource  # noqa: PLC0415  (Unix only)
    except ImportError:
        return None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Usage(usage.ru_utime, usage.ru_stime, int(usage.ru_maxrss))


def _execute(job: JobRecord, lease: GPULease, fds: list[int], pool: GPUPool) -> _child.JobEnd:
    """Run the job until it ends (or is ended); how it ended."""
    if _Cancel.requested:
        return _child.JobEnd(0, False, True)
    env = lease.env(dict(job.environment))
    env[JOB_ID_VAR] = job.id
    if job.array_id is not None:
        env[ARRAY_ID_VAR], env[ARRAY_INDEX_VAR] = job.array_id, str(job.array_index)
    limit = job.time_limit
    deadline = None if limit is None else _granted_at(pool, lease) + limit
    if deadline is not None and time.monotonic() >= deadline:
        _child.say(f"hwpool: {job.id}'s time limit ({limit} s, counted from its grant, as the "
                   "server counts it) ran out before it could start: not starting it")  # fmt: skip
        return _child.JobEnd(0, True, False)
    _child.say(f"hwpool: {job.id} runs on {', '.join(lease.devices) or 'no GPU'}")
    stdin = os.open(os.devnull, os.O_RDONLY)
    try:
        return _child.run_job_to_end(
            job.argv, env, GRACE_S, lambda: not _Cancel.requested and not lease.revoked,
            lambda: _ending_why(job, lease),
            deadline=deadline,
            late=f"hwpool: {job.id} ran past its time limit ({limit} s): ending it (SIGTERM, "
            f"then SIGKILL after {GRACE_S:g} s)",
            cwd=job.cwd, stdio=(stdin, fds[0], fds[1]),
        )  # fmt: skip
    except OSError as exc:  # the working directory is gone, say
        _child.say(f"hwpool: {job.id} could not start: {exc}")
        missing = isinstance(exc, FileNotFoundError)
        return _child.JobEnd(_exits.NOT_FOUND if missing else _exits.CANNOT_RUN, False, False)
    finally:
        os.close(stdin)


def _granted_at(pool: GPUPool, lease: GPULease) -> float:
    """When ``lease`` was granted (``time.monotonic()``): the server counts its time limit
    from then, and so does the launcher, however late it started. Now where unknown."""
    held_since = getattr(pool._backend, "held_since", None)
    grant = lease._grant
    since = None if held_since is None or grant is None else held_since(grant.ticket)
    return time.monotonic() if since is None else float(since)


def _ending_why(job: JobRecord, lease: GPULease) -> str:
    if _Cancel.requested:
        return f"hwpool: {job.id} was cancelled: ending it (SIGTERM, then SIGKILL after " \
               f"{GRACE_S:g} s)"  # fmt: skip
    if _child.ended_for_overuse(lease):
        return (
            f"hwpool: {job.id}'s lease #{lease.id} was ended for overuse (it used more GPU "
            "memory than it was leased; the server's over-lease policy is term): ending it"
        )
    return (
        f"hwpool: {job.id}'s lease #{lease.id} was revoked (`hwpool cancel {lease.id}` by an "
        "admin, or lost with the server): ending it"
    )


def _log_paths(directory: Path, job: JobRecord) -> tuple[Path, Path]:
    logs = directory / LOGS
    with contextlib.suppress(FileExistsError):
        logs.mkdir(mode=0o700)
    info = os.lstat(logs)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise UnsafePathError(
            f"the job log folder {str(logs)!r} is not a private folder of yours (a symbolic "
            f"link, another's, or open to others): remove it, and it is made again"
        )
    return logs / f"{job.id}.out", logs / f"{job.id}.err"


def _open_log(path: Path) -> int:
    """Open a job's log for appending (the user's own regular file, never through a
    symbolic link); inheritable, for the job. Never truncated: a launcher opens the logs
    before the table says whether it may run the job, and one turned away (the job runs
    under another launcher) must leave the running job's output alone."""
    fd = open_side_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, what="job log")
    os.set_blocking(fd, True)
    return fd


def _stdin_from_devnull() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
