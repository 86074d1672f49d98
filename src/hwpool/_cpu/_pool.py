"""CPUPool: persistent worker threads that run row-parallel jobs together with the caller.

Dispatch uses one job slot and an epoch counter. Worker ``i`` owns two locks used as binary
semaphores: the caller publishes the job, releases ``wake[i]`` for each worker the job needs,
runs its own share, then acquires ``done[i]`` of each. A worker acquires ``wake[i]`` (after
polling it ``spin`` times), runs its share, releases ``done[i]``. Because the caller takes every
``done`` token before it publishes the next job, a worker runs each job it is woken for exactly
once, and a worker that is not woken keeps sleeping.

Rules the reference pool left open:

- Errors: every participant's exception is caught; once all have finished, one exception is
  re-raised in the caller as it is, several as a ``BaseExceptionGroup``. Each carries a note
  naming its participant. A failing row job stops handing out new row ranges.
- Re-entrancy: a job started from inside any CPUPool job (from a worker, or from the caller's
  share) runs serially in the calling thread, so a pool never waits on itself.
- Concurrency: callers on different threads take turns on one dispatch lock.
- Fork: the child gets fresh locks and, at its next dispatch, fresh worker threads.
- Lifetime: workers hold no reference to the pool; a finalizer stops them when the pool is
  collected, and they are daemon threads, so a forgotten pool never blocks interpreter exit.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType

from .._check import check_callable, check_int
from .._errors import PoolClosedError
from .._host._sizing import effective_threads, spin_from_env
from .._numa._methods import NumaMethods
from ._jobs import Job, RowSpace, check_grain, check_rows, default_grain

__all__ = ["CPUPool", "default_grain"]

_STOP = Job(-1, lambda job, index: None, 0)  # in the job slot: workers exit
_IDLE = Job(0, lambda job, index: None, 0)  # in the job slot between jobs
_local = threading.local()


def _in_job() -> bool:
    return getattr(_local, "depth", 0) > 0


def _run_share(job: Job, index: int) -> None:
    """Run participant ``index``'s share of ``job``, marking this thread as inside a job."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        job.run_share(index)
    finally:
        _local.depth -= 1


def _park(wake: threading.Lock, spin: int) -> None:
    for _ in range(spin):
        if wake.acquire(False):
            return
    wake.acquire()


class _Workers:
    """The threads and locks of a pool; shared with the workers instead of the pool itself."""

    def __init__(self, n_workers: int, spin: int) -> None:
        self.n_workers = n_workers
        self.spin = spin
        self.job = _STOP
        self.stopped = False
        self.reset()

    def reset(self) -> None:
        """Fresh locks and no threads (at start, and in a forked child)."""
        self.wake = [_locked() for _ in range(self.n_workers)]
        self.done = [_locked() for _ in range(self.n_workers)]
        self.last_epoch = [-1] * self.n_workers
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for index in range(self.n_workers):
            name = f"hwpool-cpu-{index}"
            thread = threading.Thread(target=_worker, args=(self, index), name=name, daemon=True)
            self.threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Tell every worker to exit; only valid while no job is in flight. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        self.job = _STOP
        for wake in self.wake[: len(self.threads)]:
            wake.release()


def _locked() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


def _worker(workers: _Workers, index: int) -> None:
    wake, done = workers.wake[index], workers.done[index]
    while True:
        _park(wake, workers.spin)
        job = workers.job
        if job is _STOP:
            return
        workers.last_epoch[index] = job.epoch
        _run_share(job, index)
        done.release()


_live_pools: weakref.WeakSet[CPUPool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_live_pools):
        pool._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class CPUPool(NumaMethods):
    """A persistent team of ``n_workers`` threads plus the calling thread for row-parallel jobs.

    Every job runs on the workers it needs and on the caller, whose participant index is
    ``n_workers``. ``spin`` (default ``HWPOOL_SPIN``, else 0) is how often an idle worker polls
    for work before it sleeps. Raises TypeError/ValueError for bad arguments; using a closed
    pool raises :class:`hwpool.PoolClosedError`.
    """

    def __init__(self, n_workers: int, *, spin: int | None = None) -> None:
        n_workers = check_int("n_workers", n_workers, minimum=0)
        spin = spin_from_env() if spin is None else check_int("spin", spin, minimum=0)
        self._n_workers = n_workers
        self._spin = spin
        self._dispatch_lock = threading.Lock()
        self._epoch = 0
        self._dispatcher: int | None = None  # thread running a dispatch, if any
        self._closed = False
        self._workers = _Workers(n_workers, self._spin)
        self._remember_cpu_mask()
        self._workers.start()
        self._finalizer = weakref.finalize(self, _Workers.stop, self._workers)
        _live_pools.add(self)

    @classmethod
    def from_env(cls) -> CPUPool | None:
        """A pool of ``effective_threads() - 1`` workers, or None when the team would be 1."""
        team = effective_threads()
        return cls(team - 1) if team > 1 else None

    @property
    def n_workers(self) -> int:
        """Worker threads (the caller is not counted)."""
        return self._n_workers

    @property
    def n_participants(self) -> int:
        """Threads that run a job: the workers plus the caller."""
        return self._n_workers + 1

    @property
    def spin(self) -> int:
        """Polls of the wake-up lock an idle worker makes before it sleeps."""
        return self._spin

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    def run(self, f: Callable[[int, int], object]) -> None:
        """Call ``f(participant_index, n_participants)`` on every worker and on the caller.

        Returns when all calls have returned; re-raises their exceptions (module docstring).
        """
        check_callable("f", f)
        n = self.n_participants
        self._dispatch(lambda epoch: Job(epoch, lambda job, index: f(index, n), n), n)

    def run_rows(
        self, rows: int, f: Callable[[int, int], object], *, grain: int | None = None
    ) -> None:
        """Call ``f(start, end)`` over disjoint ranges covering ``0..rows`` exactly once.

        Ranges hold ``grain`` rows (the last may hold fewer; default :func:`default_grain`) and
        are pulled from one shared cursor, so faster participants take more of them. Only as
        many workers as there are ranges are woken.
        """
        self.run_many([(rows, f)], grain=grain)

    def run_many(
        self,
        jobs: Sequence[tuple[int, Callable[[int, int], object]]],
        *,
        grain: int | None = None,
    ) -> None:
        """Run several row spaces in one dispatch; each ``f`` sees its own row indices."""
        spaces = self._row_spaces(jobs, grain)
        chunks = sum(space.chunks for space in spaces)
        if chunks == 0:
            self._check_open()
            return
        team = min(chunks, self.n_participants)
        self._dispatch(lambda epoch: Job.rows(epoch, spaces, team), team)

    def close(self) -> None:
        """Stop and join the workers after any running job; later jobs raise PoolClosedError.

        Idempotent. Raises RuntimeError when called from inside one of this pool's jobs.
        """
        me = threading.current_thread()
        if me.ident == self._dispatcher or me in self._workers.threads:
            raise RuntimeError("CPUPool.close() called from inside one of its own jobs")
        with self._dispatch_lock:
            if self._closed:
                return
            self._closed = True
            self._finalizer()
        for thread in self._workers.threads:
            thread.join()

    def __enter__(self) -> CPUPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"CPUPool(n_workers={self._n_workers}, spin={self._spin}) <{state}>"

    def _row_spaces(
        self, jobs: Sequence[tuple[int, Callable[[int, int], object]]], grain: int | None
    ) -> list[RowSpace]:
        if grain is not None:
            grain = check_grain(grain)
        if isinstance(jobs, (str, bytes)) or not isinstance(jobs, Sequence):
            raise TypeError(f"jobs must be a sequence of (rows, f) pairs, got {jobs!r}")
        spaces = []
        for position, item in enumerate(jobs):
            if not isinstance(item, tuple) or len(item) != 2:
                raise TypeError(f"jobs[{position}] must be a (rows, f) pair, got {item!r}")
            rows, f = item
            rows = check_rows(rows)
            check_callable("f", f)
            step = grain if grain is not None else default_grain(rows, self.n_participants)
            spaces.append(RowSpace(rows, f, step))
        return spaces

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("CPUPool is closed")

    def _dispatch(self, make_job: Callable[[int], Job], team: int) -> None:
        """Run a job on ``team`` participants: ``team - 1`` workers and the caller."""
        self._check_open()
        if not _in_job():
            self._adopt_numa()
        if _in_job() or team == 1 or self._n_workers == 0:
            self._run_serial(make_job(-1))
            return
        with self._dispatch_lock:
            self._check_open()
            job = self._publish(make_job)
            helpers = min(team, self.n_participants) - 1
            self._dispatcher = threading.get_ident()
            try:
                for index in range(helpers):
                    self._workers.wake[index].release()
                _run_share(job, self._n_workers)
                _wait(self._workers.done[:helpers], job)
            finally:
                self._dispatcher = None
                self._workers.job = _IDLE
        job.raise_errors()

    def _publish(self, make_job: Callable[[int], Job]) -> Job:
        if not self._workers.threads:  # first dispatch in a forked child
            self._workers.start()
        self._epoch += 1
        job = make_job(self._epoch)
        self._workers.job = job
        return job

    def _run_serial(self, job: Job) -> None:
        """Run every participant's share in this thread, one after the other."""
        for index in range(job.n_participants):
            _run_share(job, index)
        job.raise_errors()

    def _reset_after_fork(self) -> None:
        self._dispatch_lock = threading.Lock()
        self._dispatcher = None
        self._workers.reset()


def _wait(done: list[threading.Lock], job: Job) -> None:
    """Take each worker's done token; an interrupt cuts the job short but still waits."""
    interrupt: BaseException | None = None
    for lock in done:
        while True:
            try:
                lock.acquire()
                break
            except BaseException as exc:
                job.failed = True
                interrupt = interrupt or exc
    if interrupt is not None:
        raise interrupt
