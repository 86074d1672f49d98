"""CPUPool: persistent worker threads that run row-parallel jobs together with the caller.

Dispatch publishes a job in one slot, wakes only the workers it needs, runs the caller's share,
then waits for each worker to have run it (the hand-shake and why it survives interrupts are in
``_workers``). Rules the reference pool left open:

- Errors: every participant's exception is caught; once all have finished, one exception is
  re-raised in the caller as it is, several as a ``BaseExceptionGroup``. Each carries a note
  naming its participant. A failing row job stops handing out new row ranges.
- Interrupts: a KeyboardInterrupt (or any exception) raised in the dispatch itself, at any
  point, fails the job and is re-raised only after every worker woken for it has finished; the
  pool stays usable. Should a second one cut even that short, the next dispatch (or ``close``)
  finishes the job first.
- Re-entrancy: a job started from inside any CPUPool job (from a worker, or from the caller's
  share) runs serially in the calling thread, so a pool never waits on itself. Shares run in a
  copy of their thread's context (the mark that says "inside a job" lives there).
- Concurrency: callers on different threads take turns on one dispatch lock.
- Fork: the child gets fresh locks (the NUMA binder's too) and, at its next dispatch, fresh
  worker threads.
- Lifetime: workers hold no reference to the pool; a finalizer stops them when the pool is
  collected, and they are daemon threads, so a forgotten pool never blocks interpreter exit.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType

from .._check import check_callable, check_int
from .._errors import PoolClosedError
from .._host._sizing import effective_threads, spin_from_env
from .._numa._bind import NumaBinder
from .._numa._deprecated import DeprecatedNumaMethods
from ._jobs import Job, RowSpace, check_grain, check_rows, default_grain
from ._workers import Workers, in_job, run_share, settle

__all__ = ["CPUPool", "default_grain"]

_live_pools: weakref.WeakSet[CPUPool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_live_pools):
        pool._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _release_if_mine(lock: threading.RLock) -> None:
    """Release ``lock`` if this thread holds it: an RLock refuses any other thread."""
    with contextlib.suppress(RuntimeError):
        lock.release()


class CPUPool(DeprecatedNumaMethods):
    """A persistent team of ``n_workers`` threads plus the calling thread for row-parallel jobs.

    Every job runs on the workers it needs and on the caller, whose participant index is
    ``n_workers``. ``spin`` (default ``HWPOOL_SPIN``, else 0) is how often an idle worker polls
    for work before it sleeps. NUMA binding and page placement are ``pool.numa``
    (a :class:`NumaBinder`). Raises TypeError/ValueError for bad arguments; using a closed
    pool raises :class:`hwpool.PoolClosedError`.
    """

    def __init__(self, n_workers: int, *, spin: int | None = None) -> None:
        n_workers = check_int("n_workers", n_workers, minimum=0)
        spin = spin_from_env() if spin is None else check_int("spin", spin, minimum=0)
        self._n_workers = n_workers
        self._spin = spin
        # An RLock: only its holder can release it, which _dispatch relies on.
        self._dispatch_lock = threading.RLock()
        self._epoch = 0
        self._closed = False
        self._workers = Workers(n_workers, self._spin)
        # The creator's CPU mask: the CPUs binding may choose from (a bound thread sees less).
        allowed = (
            tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
        )
        self._numa = NumaBinder(weakref.proxy(self), allowed=allowed)
        self._workers.start()
        self._finalizer = weakref.finalize(self, Workers.stop, self._workers)
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
    def numa(self) -> NumaBinder:
        """The pool's NUMA binder: binding to nodes, two-node mode, page placement."""
        return self._numa

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

        Ranges hold ``grain`` rows (the last may hold fewer) and are pulled from one shared
        cursor, so faster participants take more of them. By default they hold
        :func:`default_grain` rows and the last ``n_participants`` are cut finer, so that the
        participants finish together. Only as many workers as there are ranges are woken.
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
        if in_job(self._workers):
            raise RuntimeError("CPUPool.close() called from inside one of its own jobs")
        with self._dispatch_lock:
            if self._closed:
                return
            interrupt = settle(self._workers)  # a job an interrupted dispatch left unfinished
            self._closed = True
            self._finalizer()
        for thread in self._workers.threads:
            thread.join()
        if interrupt is not None:
            raise interrupt

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
            if grain is None:
                spaces.append(RowSpace.tailed(rows, f, self.n_participants))
            else:
                spaces.append(RowSpace(rows, f, grain))
        return spaces

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("CPUPool is closed")

    def _dispatch(self, make_job: Callable[[int], Job], team: int) -> None:
        """Run a job on ``team`` participants: ``team - 1`` workers and the caller."""
        self._check_open()
        nested = in_job()
        if not nested:
            self._numa._adopt()  # the caller's node mask, once per thread and binding
        if nested or team == 1 or self._n_workers == 0:
            self._run_serial(make_job(-1))
            return
        lock = self._dispatch_lock
        try:
            with lock:
                self._check_open()
                job = self._run_job(make_job, team)
        except BaseException:
            # A `with` exits through its own line, where a trace function (never a signal) can
            # raise before the lock is released; nowhere else can this thread still hold it.
            _release_if_mine(lock)
            raise
        job.raise_errors()

    def _run_job(self, make_job: Callable[[int], Job], team: int) -> Job:
        """Publish, wake, run the caller's share and wait; see the module docstring.

        The normal path finishes the job inside the ``try``; any exception on the way finishes
        it in the ``except`` (both are idempotent), and only then is re-raised.
        """
        workers = self._workers
        try:
            settle(workers)  # a job that an earlier, interrupted dispatch left unfinished
            if not workers.started:  # at creation, and at the first dispatch after a fork
                workers.start()
            self._epoch += 1
            job = make_job(self._epoch)
            workers.job = job
            workers.wake_helpers(job)
            run_share(workers, job, self._n_workers)
            interrupt = settle(workers)
        except BaseException:
            workers.job.failed = True
            settle(workers)
            raise
        if interrupt is not None:
            raise interrupt
        return job

    def _run_serial(self, job: Job) -> None:
        """Run every participant's share in this thread, one after the other."""
        for index in range(job.n_participants):
            run_share(self._workers, job, index)
        job.raise_errors()

    def _reset_after_fork(self) -> None:
        self._dispatch_lock = threading.RLock()
        self._workers.reset()
        self._numa._reset_after_fork()
