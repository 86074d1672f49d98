"""``hwpool.Job``: a handle on one job of the user's job table, for scripts and tests.

A handle holds only the job's id and where the table is: every property reads the table
afresh (the supervisor and the job's launcher change it from other processes), so a handle
is never stale and costs nothing to keep. ``hwpool.submit(...)`` returns one; ``Job("j12")``
makes one for a job submitted earlier (``hwpool submit`` printed its id). The commands
``hwpool wait``, ``logs``, ``cancel jN`` and ``retry`` do what its methods do, with the
same functions (``_control``, ``_logs``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path

from ._control import cancel_job, wait_for
from ._logs import LogNotStartedError, read_log
from ._model import JobRecord, JobState, check_job_id
from ._start import ensure_supervisor
from ._start import wake_supervisor as poke_supervisor
from ._state import TABLE_NAME, prepare_state_directory, state_directory
from ._store import JobStore, UnknownJobError
from ._submit import submit_job, user_name

__all__ = ["Job", "open_table", "start_supervisor", "submit", "wake_supervisor"]


def open_table(directory: Path) -> JobStore | None:
    """The job table in ``directory``, or None when there is none yet (nothing was ever
    submitted there: it is not created just to be read). UnsafePathError and
    JobTableError as :meth:`JobStore.open` raises them."""
    if not _exists(directory):
        return None
    prepare_state_directory(directory)  # checked, so that a folder not ours is refused
    if not _exists(directory / TABLE_NAME):
        return None
    return JobStore.open(directory)


def _exists(path: Path) -> bool:
    """Whether ``path`` exists (a link too); PermissionError when it cannot be known (a
    folder above it is closed to this user: another's)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _table(directory: Path, job_id: str) -> JobStore:
    """The table in ``directory``; UnknownJobError naming ``job_id`` when there is none."""
    store = open_table(directory)
    if store is None:
        raise UnknownJobError(
            f"job_id: no job {job_id!r}: no job table in {str(directory)!r} (nothing was "
            "submitted with this state directory)"
        )
    return store


def start_supervisor(directory: Path) -> None:
    """Make sure the user's supervisor runs (woken, or started), to run the jobs of
    ``directory``'s table: after a submit or a retry."""
    ensure_supervisor(directory)


def wake_supervisor(directory: Path) -> None:
    """Wake the user's supervisor if one runs (none is started: with none running, nothing
    holds a request for a job just cancelled); after a cancel, so that it withdraws the
    cancelled job's request at once rather than at its next look at the table."""
    with contextlib.suppress(OSError):
        poke_supervisor(directory)


class Job:
    """A job in the user's job table, by its id (``"j12"``).

    ``state_dir`` is the state directory whose table holds it (default: the user's,
    ``HWPOOL_STATE_DIR``, else ``$XDG_STATE_HOME/hwpool``, else ``~/.local/state/hwpool``).
    Every property and method reads the table afresh. Methods raise ``LookupError``
    (``UnknownJobError``) for a job the table does not hold (never submitted, or pruned
    after its retention), and ``OSError`` (``UnsafePathError``) for a table or log whose
    path is not safe to trust.
    """

    __slots__ = ("_directory", "_id")

    def __init__(self, job_id: str, *, state_dir: str | os.PathLike[str] | None = None) -> None:
        """A handle on the job ``job_id`` (checked: ``j`` then a number; ValueError
        otherwise, TypeError for a non-string). The job itself is looked up on use."""
        check_job_id("job_id", job_id)
        self._id = job_id
        self._directory = state_directory() if state_dir is None else Path(state_dir)

    @property
    def id(self) -> str:
        """The job's id, such as ``"j12"``."""
        return self._id

    @property
    def state_dir(self) -> Path:
        """The state directory whose table holds the job."""
        return self._directory

    def record(self) -> JobRecord:
        """The job's record as the table holds it now."""
        with _table(self._directory, self._id) as store:
            return store.get(self._id)

    @property
    def state(self) -> JobState:
        """Where the job is now (``JobState.RUNNING``, ``JobState.SUCCEEDED``, ...)."""
        return self.record().state

    @property
    def exit_code(self) -> int | None:
        """The job's own exit code once it exited (0 to 255); None while it has not
        finished, and when a signal ended it (``record().signal`` says which) or it never
        ran."""
        return self.record().exit_code

    def wait(self, timeout: float | None = None) -> JobRecord:
        """Block until the job finishes; its finished record. ``TimeoutError`` when
        ``timeout`` seconds pass first (the job goes on)."""
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        with _table(self._directory, self._id) as store:
            return wait_for(store, [self._id], timeout)[self._id]

    def logs(self, stderr: bool = False) -> str:
        """The job's output so far (its stdout, or its ``stderr``), decoded as UTF-8 with
        undecodable bytes replaced; empty for a job that has not started or never did."""
        try:
            data = read_log(self.record(), stderr)
        except LogNotStartedError:
            return ""
        return data.decode("utf-8", "replace")

    def cancel(self) -> JobRecord:
        """Cancel the job: a queued or waiting one is recorded cancelled (and the jobs that
        depended on it); a running one is ended by its launcher (SIGTERM, SIGKILL after its
        grace), awaited for a bounded time. A finished job is left as it is. The record
        after."""
        with _table(self._directory, self._id) as store:
            outcome = cancel_job(store, self._id, by=user_name())
        wake_supervisor(self._directory)
        return outcome.record

    def hold(self) -> JobRecord:
        """Hold the queued or waiting job: it keeps its place among this user's jobs but is
        never started until :meth:`release`. ``ValueError`` (``JobStateError``) for a job
        that runs or has finished. The record after."""
        with _table(self._directory, self._id) as store:
            record = store.hold(self._id, user_name())
        wake_supervisor(self._directory)  # so that it withdraws the job's request at once
        return record

    def release(self) -> JobRecord:
        """Release the job's hold (a job nobody holds is left as it is); ``ValueError``
        (``JobStateError``) for a job that runs or has finished. The record after."""
        with _table(self._directory, self._id) as store:
            record = store.release_hold(self._id)
        start_supervisor(self._directory)
        return record

    def retry(self) -> Job:
        """Queue the finished job again as a new job (same command, environment, request,
        dependencies); the new job's handle. ``ValueError`` (``JobStateError``) for a job
        that has not finished."""
        with _table(self._directory, self._id) as store:
            again = store.retry(self._id)
        start_supervisor(self._directory)
        return Job(again.id, state_dir=self._directory)

    def __repr__(self) -> str:
        return f"Job({self._id!r}, state_dir={str(self._directory)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Job):
            return NotImplemented
        return (self._id, self._directory) == (other._id, other._directory)

    def __hash__(self) -> int:
        return hash((self._id, self._directory))


def submit(
    argv: Sequence[str],
    *,
    gpus: Fraction | int | float | None = None,
    memory: int | str | None = None,
    name: str | None = None,
    priority: int = 0,
    time: float | str | None = None,
    after: Iterable[str | Job] = (),
    after_any: Iterable[str | Job] = (),
    after_notok: Iterable[str | Job] = (),
    hold: bool = False,
    notify: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> Job:
    """Queue ``argv`` as a job of this user, as ``hwpool submit`` does; its handle.

    ``gpus``: a fraction in (0, 1] of one GPU or an int >= 2 of whole GPUs (default: one
    GPU); or ``memory`` (MiB, or a size such as ``"20GiB"``) of one GPU instead. ``time``: a
    limit (seconds, or ``"90s"``, ``"30m"``, ``"2h"``): past it the job is ended and recorded
    timed-out. ``after``: jobs (ids or handles) that must succeed first; ``after_any``: that
    must have ended, however; ``after_notok``: of which one must end without success (for
    clean-up and alerts). ``hold``: held until :meth:`Job.release`. ``notify``: a shell
    command run once it has ended (default: the user's ``notify`` setting; ``""``: none).
    ``cwd`` and ``env``: default this process's. The user's supervisor is started if none
    runs. Bad values raise TypeError or ValueError naming the argument, and queue nothing."""
    directory = state_directory() if state_dir is None else Path(state_dir)
    of_ok, of_any, of_notok = (
        [job.id if isinstance(job, Job) else job for job in _listed(ids)]
        for ids in (after, after_any, after_notok)
    )
    record = submit_job(
        argv, gpus=gpus, memory=memory, name=name, priority=priority, time=time,
        after=of_ok, after_any=of_any, after_notok=of_notok, hold=hold, notify=notify,
        cwd=cwd, env=env,
        state_dir=directory,
    )  # fmt: skip
    return Job(record.id, state_dir=directory)


def _listed(after: Iterable[str | Job]) -> list[str | Job]:
    """``after`` as a list (one id or handle given alone is a list of one)."""
    if isinstance(after, str | Job):
        return [after]
    return list(after)
