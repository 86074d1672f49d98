"""The worker threads of a CPU pool and the hand-shake that runs each published job once.

State is one job slot plus, per worker ``i``, a wake lock, a done lock and ``finished[i]``, the
epoch of the last job worker ``i`` ran. The locks are tokens (held = no token): ``give`` puts a
token only where none is waiting, and only one thread ever gives each lock (the dispatcher the
wake locks, worker ``i`` its done lock), so a give never fails and never doubles.

The truth is in the epochs, not in the tokens. A worker runs the job in the slot when it is one
of its helpers and it has not run that epoch yet, whatever woke it; the dispatcher waits for
``finished[i] == epoch``, taking done tokens only to sleep. A token left over by an interrupted
dispatch therefore wakes somebody for nothing, and never makes a later wait return early, and a
wait retried after an exception (KeyboardInterrupt just after a successful acquire) re-reads the
epochs instead of acquiring a token that will never come.

A job stays in the slot until :meth:`Workers.finish` has seen every helper run it, so a dispatch
cut short anywhere is finished by the next one (or by ``close``) before anything else runs.
"""

from __future__ import annotations

import contextvars
import threading

from ._jobs import Job

__all__ = ["IDLE", "STOP", "Workers", "give", "in_job", "run_share", "settle"]

STOP = Job(-1, lambda job, index: None, 1)  # in the job slot: workers exit
IDLE = Job(0, lambda job, index: None, 1)  # in the job slot between jobs

# The pools (their Workers) whose job the current context is running a share of.
_enclosing: contextvars.ContextVar[tuple[Workers, ...]] = contextvars.ContextVar(
    "hwpool_cpu_enclosing", default=()
)


def in_job(workers: Workers | None = None) -> bool:
    """Whether this thread runs a share of a job (of ``workers``' pool, when given)."""
    enclosing = _enclosing.get()
    return bool(enclosing) if workers is None else workers in enclosing


def run_share(workers: Workers, job: Job, index: int) -> None:
    """Run participant ``index``'s share of ``job``, marked as inside a job of ``workers``.

    The mark lives in a copy of the thread's context that is dropped when the share returns,
    so no exception, wherever it is raised, can leave it behind.
    """
    contextvars.copy_context().run(_marked_share, workers, job, index)


def _marked_share(workers: Workers, job: Job, index: int) -> None:
    _enclosing.set((*_enclosing.get(), workers))
    job.run_share(index)


def give(lock: threading.Lock) -> None:
    """Put a token in ``lock`` unless one is already there (only one thread gives each lock)."""
    if lock.locked():
        lock.release()


def _locked() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


def _park(wake: threading.Lock, spin: int) -> None:
    for _ in range(spin):
        if wake.acquire(False):
            return
    wake.acquire()


class Workers:
    """The threads, locks and job slot of one pool; shared with the workers instead of the
    pool itself, so that they hold no reference to it."""

    def __init__(self, n_workers: int, spin: int) -> None:
        self.n_workers = n_workers
        self.spin = spin
        self.stopped = False
        self.reset()

    def reset(self) -> None:
        """Fresh locks, an empty slot and no threads (at start, and in a forked child)."""
        self.job = STOP if self.stopped else IDLE
        self.wake = [_locked() for _ in range(self.n_workers)]
        self.done = [_locked() for _ in range(self.n_workers)]
        self.finished = [-1] * self.n_workers
        self.last_epoch = [-1] * self.n_workers  # the epoch each worker last started
        self.threads: list[threading.Thread] = []
        self.started = False

    def start(self) -> None:
        """Start the threads that are missing (all of them at start and after a fork)."""
        while len(self.threads) < self.n_workers:
            index = len(self.threads)
            name = f"hwpool-cpu-{index}"
            self.threads.append(
                threading.Thread(target=_worker, args=(self, index), name=name, daemon=True)
            )
        for thread in self.threads:
            if thread.ident is None:
                thread.start()
        self.started = True

    def wake_helpers(self, job: Job) -> None:
        """Give each helper of ``job`` its wake token, counting them in ``job.woken``."""
        for index in range(job.helpers):
            give(self.wake[index])
            job.woken = index + 1

    def finish(self, spin: int = 0) -> None:
        """Wake the helpers an interrupt kept asleep, wait until every helper has run the job in
        the slot, and empty the slot. Idempotent, so it can be retried after any exception.

        ``spin``: polls of each done token before sleeping on it.
        """
        job = self.job
        epoch, finished = job.epoch, self.finished
        for index in range(job.woken, job.helpers):
            if finished[index] != epoch:
                give(self.wake[index])
        for index in range(job.helpers):
            done = self.done[index]
            for _ in range(spin):
                if finished[index] == epoch or done.acquire(False):
                    break
            while finished[index] != epoch:
                done.acquire()
        self.job = IDLE

    def stop(self) -> None:
        """Tell every worker to exit; only valid while the slot is empty. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        self.job = STOP
        for wake in self.wake[: len(self.threads)]:
            give(wake)


def settle(workers: Workers, spin: int = 0) -> BaseException | None:
    """Finish the job in the slot whatever is raised meanwhile; return the first exception.

    An exception (Ctrl-C) marks the job failed, so that its row jobs stop handing out rows, and
    the finishing goes on: the wake-ups and waits are idempotent.
    """
    first: BaseException | None = None
    while workers.job is not IDLE and workers.job is not STOP:
        try:
            workers.finish(spin)
        except BaseException as exc:
            workers.job.failed = True
            if first is None:
                first = exc
    return first


def _worker(workers: Workers, index: int) -> None:
    wake, done, finished = workers.wake[index], workers.done[index], workers.finished
    while True:
        _park(wake, workers.spin)
        job = workers.job
        if job is STOP:
            return
        if index < job.helpers and finished[index] != job.epoch:
            workers.last_epoch[index] = job.epoch
            run_share(workers, job, index)
            finished[index] = job.epoch
            give(done)
