"""CPUPool under KeyboardInterrupt: an exception at any line of a dispatch leaves the pool sound.

Two ways in: ``sys.settrace`` raises KeyboardInterrupt at the k-th line the calling thread runs in
hwpool's code, for every k that a dispatch reaches (one exception per trial, deterministic); and
a SIGALRM storm in a child process raises KeyboardInterrupt whenever a signal lands while the
main thread is in hwpool's code (many exceptions, wherever CPython runs signal handlers). After
either, the checks are deterministic: the interrupted call handed each row out at most once, and
the following calls run every participant exactly once and cover every row exactly once before
they return.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from types import FrameType
from typing import Any

import pytest

import hwpool
from hwpool import CPUPool
from hwpool._cpu._jobs import Job

WAIT_S = 10.0
HWPOOL_DIR = os.path.dirname(hwpool.__file__)
ROWS = 12


class Rows:
    """Thread-safe record of the rows a row job was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[int] = Counter()

    def __call__(self, start: int, end: int) -> None:
        with self.lock:
            self.counts.update(range(start, end))


def bounded(call: Callable[[], object], what: str) -> None:
    """Run ``call`` in a new thread; fail (instead of hanging) unless it returns within WAIT_S."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body, name="bounded-caller", daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), f"{what} blocked"
    if errors:
        raise errors[0]


def _schedule_interrupt(thread_id: int) -> None:
    """Make CPython raise KeyboardInterrupt in that thread at its next check for signals."""
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async(ctypes.c_ulong(thread_id), ctypes.py_object(KeyboardInterrupt))


def _noop() -> None:
    return None


def run_traced(
    call: Callable[[], object], inject_at: Collection[int] = (), *, signal_points: bool = False
) -> tuple[int, str]:
    """Run ``call``, interrupting it at the line events in hwpool's code numbered ``inject_at``.

    By default the trace function raises KeyboardInterrupt at the start of that line (once: a
    trace function that raises is unset). With ``signal_points`` it only schedules one, which
    CPython raises where it would run a signal handler (after a call, at a loop's back edge, on
    entering a function), and tracing goes on, so several can be injected.
    Returns (line events seen, outcome: "done", "interrupted" or "raised ..."); fails the test
    when the call does not return within WAIT_S (a dispatch blocked for good).
    """
    events = [0]
    outcome = ["never ran"]
    me = [threading.get_ident()]

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            events[0] += 1
            if events[0] in inject_at:
                if not signal_points:
                    raise KeyboardInterrupt
                _schedule_interrupt(me[0])
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(HWPOOL_DIR) else None

    def traced_call() -> None:
        me[0] = threading.get_ident()
        sys.settrace(tracer)
        try:
            call()
            outcome[0] = "done"  # stores: CPython raises nothing scheduled between them
        except KeyboardInterrupt:
            outcome[0] = "interrupted"
        except BaseException as exc:
            outcome[0] = f"raised {exc!r}"
        finally:
            sys.settrace(None)

    def traced() -> None:
        # At most one scheduled interrupt can be left once tracing is off: let it fire here.
        # (Not contextlib.suppress: it could fire inside suppress's own __exit__.)
        try:  # noqa: SIM105
            traced_call()
        except KeyboardInterrupt:
            pass
        try:  # noqa: SIM105
            _noop()
        except KeyboardInterrupt:
            pass

    bounded(traced, f"the dispatch interrupted at line events {sorted(inject_at)}")
    return events[0], outcome[0]


def check_sound(pool: CPUPool, what: str) -> None:
    """Later calls run each participant once and each row once, all before they return."""

    def calls() -> None:
        for _ in range(2):
            finished: Counter[int] = Counter()
            lock = threading.Lock()

            def f(index: int, n: int, finished: Counter[int] = finished, lock: Any = lock) -> None:
                sum(range(2000))  # long enough that an early return would be seen
                with lock:
                    finished[index] += 1

            pool.run(f)
            with lock:
                assert finished == Counter(range(pool.n_participants)), what
            rows = Rows()
            pool.run_rows(ROWS, rows, grain=1)
            with rows.lock:
                assert rows.counts == Counter(range(ROWS)), what

    bounded(calls, f"the pool after {what}")


@pytest.fixture
def pool() -> Iterator[CPUPool]:
    p = CPUPool(3)
    yield p
    bounded(p.close, "close()")


def row_job(pool: CPUPool) -> tuple[Callable[[], object], Counter[int]]:
    rows = Rows()
    return lambda: pool.run_rows(ROWS, rows, grain=1), rows.counts


def run_job(pool: CPUPool) -> tuple[Callable[[], object], Counter[int]]:
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def f(index: int, n: int) -> None:
        with lock:
            calls[index] += 1

    return lambda: pool.run(f), calls


@pytest.mark.parametrize("kind", ["run_rows", "run"])
def test_keyboard_interrupt_at_every_line_of_a_dispatch(pool: CPUPool, kind: str) -> None:
    make = row_job if kind == "run_rows" else run_job
    call, _ = make(pool)
    total, outcome = run_traced(call)
    assert outcome == "done" and total > 20
    interrupted = 0
    for k in range(1, total + 5):  # a little past the end: the caller's share varies in length
        call, seen = make(pool)
        _, outcome = run_traced(call, {k})
        assert outcome in ("done", "interrupted"), f"line event {k}: {outcome}"
        interrupted += outcome == "interrupted"
        check_sound(pool, f"KeyboardInterrupt at line event {k}")
        # The pool waited for every participant it woke, so nothing still adds to ``seen``.
        assert max(seen.values(), default=0) <= 1, f"line event {k}: a row or share ran twice"
        if outcome == "done":
            expected = range(ROWS) if kind == "run_rows" else range(pool.n_participants)
            assert set(seen) == set(expected), f"line event {k}: completed with work missing"
    assert interrupted >= total - 5


@pytest.mark.parametrize("kind", ["run_rows", "run"])
def test_keyboard_interrupts_where_signal_handlers_run(pool: CPUPool, kind: str) -> None:
    # One interrupt after each line event, then two and three: the later ones land while the
    # first is being handled (the dispatch finishing the job); where they cut that short too,
    # the next dispatch must finish the job before its own.
    make = row_job if kind == "run_rows" else run_job
    total, _ = run_traced(make(pool)[0])
    plans = [{k} for k in range(1, total + 5)]
    plans += [{k, k + gap} for k in range(1, total, 3) for gap in (1, 2, 4, 7, 12)]
    plans += [{k, k + 1, k + 2 + gap} for k in range(1, total, 2) for gap in range(4)]
    interrupted = 0
    for plan in plans:
        call, seen = make(pool)
        _, outcome = run_traced(call, plan, signal_points=True)
        assert outcome in ("done", "interrupted"), f"line events {plan}: {outcome}"
        interrupted += outcome == "interrupted"
        check_sound(pool, f"KeyboardInterrupt after line events {sorted(plan)}")
        assert max(seen.values(), default=0) <= 1, f"line events {plan}: ran twice"
        if outcome == "done":
            expected = range(ROWS) if kind == "run_rows" else range(pool.n_participants)
            assert set(seen) == set(expected), f"line events {plan}: completed with work missing"
    assert interrupted >= len(plans) // 2


def test_the_next_dispatch_first_finishes_a_job_left_in_the_slot(pool: CPUPool) -> None:
    # What a dispatch cut short even while finishing leaves behind: a published job that
    # some helpers were never woken for.
    left: Counter[int] = Counter()
    lock = threading.Lock()

    def share(job: Job, index: int) -> None:
        with lock:
            left[index] += 1

    pool._epoch += 1
    pool._workers.job = Job(pool._epoch, share, pool.n_participants)
    check_sound(pool, "a job left in the slot")
    assert left == Counter(range(pool.n_workers))  # each helper ran it once, before the rest


def test_close_after_an_interrupted_dispatch() -> None:
    with CPUPool(2) as probe:
        total, _ = run_traced(row_job(probe)[0])
    for k in range(1, total, 3):
        with CPUPool(2) as other:
            run_traced(row_job(other)[0], {k})
            threads = list(other._workers.threads)
        assert not any(t.is_alive() for t in threads)


STORM = """
import json, os, signal, sys, threading
from collections import Counter
import hwpool

HWPOOL_DIR = os.path.dirname(hwpool.__file__)
hits = 0

def storm(signum, frame):
    # Only inside hwpool's frames, so that this script's own bookkeeping is never cut short.
    global hits
    if frame is not None and frame.f_code.co_filename.startswith(HWPOOL_DIR):
        hits += 1
        raise KeyboardInterrupt

def job(pool, k, records):
    seen = Counter()
    lock = threading.Lock()
    records.append((k % 2, seen))
    def rows(a, b):
        sum(range(300))
        with lock:
            seen.update(range(a, b))
    def share(i, n):
        sum(range(300))
        with lock:
            seen[i] += 1
    if k % 2:
        pool.run(share)
    else:
        pool.run_rows(48, rows, grain=1)

signal.signal(signal.SIGALRM, storm)
pool = hwpool.CPUPool(3)
records, completed = [], set()
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
for k in range(int(sys.argv[1])):
    try:
        job(pool, k, records)
    except KeyboardInterrupt:
        continue
    completed.add(k)
signal.setitimer(signal.ITIMER_REAL, 0, 0)
stormed = hits
for k in range(20):  # after the storm: every call completes, exactly once
    job(pool, k, records)
    completed.add(len(records) - 1)
bad = []
for k, (kind, seen) in enumerate(records):
    expected = set(range(pool.n_participants) if kind else range(48))
    if max(seen.values(), default=0) > 1 or not set(seen) <= expected:
        bad.append((k, "twice"))
    elif k in completed and set(seen) != expected:
        bad.append((k, "incomplete"))
pool.close()
print(json.dumps({"hits": stormed, "interrupted": len(records) - len(completed), "bad": bad[:5]}))
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs setitimer")
def test_sigalrm_storm_leaves_the_pool_sound() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(STORM), "1500"],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["bad"] == []
    assert result["hits"] > 0 and result["interrupted"] > 0, result
