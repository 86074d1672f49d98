"""CPUPool: dispatch, row coverage, errors, nesting, concurrency, lifetime and fork."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

import hwpool
from hwpool import CPUPool, PoolClosedError
from hwpool._cpu._cursor import Cursor
from hwpool._cpu._jobs import default_grain

WAIT_S = 10.0


@pytest.fixture
def pool() -> Iterator[CPUPool]:
    with CPUPool(3) as p:
        yield p


class Ranges:
    """Thread-safe record of the (start, end) ranges a row job was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> None:
        with self.lock:
            self.seen.append((start, end))

    def assert_cover(self, rows: int, grain: int) -> None:
        covered = Counter(row for start, end in self.seen for row in range(start, end))
        assert covered == Counter(range(rows))
        assert all(0 < end - start <= grain for start, end in self.seen)


# --- run -------------------------------------------------------------------------------


def test_run_calls_every_participant_once(pool: CPUPool) -> None:
    calls: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def f(index: int, n: int) -> None:
        with lock:
            calls.append((index, n, threading.get_ident()))

    pool.run(f)
    assert sorted(c[:2] for c in calls) == [(i, 4) for i in range(4)]
    assert pool.n_participants == 4
    caller = [c for c in calls if c[0] == pool.n_workers]
    assert caller[0][2] == threading.get_ident()
    assert len({c[2] for c in calls}) == 4


def test_worker_identity_is_stable(pool: CPUPool) -> None:
    def idents() -> dict[int, int]:
        out: dict[int, int] = {}
        pool.run(lambda i, n: out.__setitem__(i, threading.get_ident()))
        return out

    first = idents()
    for _ in range(20):
        assert idents() == first


def test_zero_worker_pool_runs_in_the_caller() -> None:
    with CPUPool(0) as p:
        seen: list[tuple[int, int, int]] = []
        p.run(lambda i, n: seen.append((i, n, threading.get_ident())))
        assert seen == [(0, 1, threading.get_ident())]


# --- run_rows / run_many --------------------------------------------------------------


@pytest.mark.parametrize("rows", [0, 1, 2, 3, 5, 24, 100, 1000, 4097])
def test_run_rows_covers_each_row_once(pool: CPUPool, rows: int) -> None:
    ranges = Ranges()
    pool.run_rows(rows, ranges)
    ranges.assert_cover(rows, default_grain(rows, pool.n_participants))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 300), grain=st.integers(1, 50) | st.none(), workers=st.integers(0, 3))
def test_run_rows_cover_property(rows: int, grain: int | None, workers: int) -> None:
    with CPUPool(workers) as p:
        ranges = Ranges()
        p.run_rows(rows, ranges, grain=grain)
        ranges.assert_cover(rows, grain or default_grain(rows, p.n_participants))


def test_rows_zero_never_calls_f(pool: CPUPool) -> None:
    pool.run_rows(0, lambda a, b: pytest.fail("called"))


def test_one_row_runs_in_the_caller(pool: CPUPool) -> None:
    seen: list[tuple[int, int, int]] = []
    pool.run_rows(1, lambda a, b: seen.append((a, b, threading.get_ident())))
    assert seen == [(0, 1, threading.get_ident())]


def test_the_default_split_cuts_its_last_ranges_finer() -> None:
    # The last ranges decide when the slowest participant finishes: 256 rows each left the
    # other one idle for up to a whole range at the end of every matvec.
    with CPUPool(1) as p:
        ranges = Ranges()
        p.run_rows(4096, ranges)
    sizes = [end - start for start, end in sorted(ranges.seen)]
    assert sizes == [256] * 15 + [128, 64, 32, 32]
    ranges.assert_cover(4096, default_grain(4096, 2))


def test_default_grain_examples() -> None:
    assert default_grain(24, 49) == 1
    assert default_grain(4096, 49) == 32
    assert default_grain(32768, 49) == 83
    assert default_grain(0, 4) == 1


def test_few_chunks_wake_only_the_workers_needed(pool: CPUPool) -> None:
    epochs = pool._workers.last_epoch
    pool.run(lambda i, n: None)
    before = list(epochs)
    pool.run_rows(3, Ranges(), grain=1)  # 3 chunks: the caller and workers 0 and 1
    assert epochs[0] == epochs[1] == before[0] + 1
    assert epochs[2] == before[2]
    pool.run_rows(2, Ranges(), grain=1)
    assert epochs[0] == before[0] + 2
    assert epochs[1:] == [before[0] + 1, before[2]]


def test_partial_jobs_never_make_a_worker_skip_or_repeat(pool: CPUPool) -> None:
    for chunks in [1, 2, 3, 4, 9, 2, 1, 3, 4, 2] * 5:
        counts: Counter[int] = Counter()
        lock = threading.Lock()
        ranges = Ranges()
        pool.run_rows(chunks, ranges, grain=1)
        ranges.assert_cover(chunks, 1)

        def f(
            index: int, n: int, counts: Counter[int] = counts, lock: threading.Lock = lock
        ) -> None:
            with lock:
                counts[index] += 1

        pool.run(f)
        assert counts == Counter(range(pool.n_participants))


def test_run_many_gives_each_function_its_own_rows(pool: CPUPool) -> None:
    a, b, c = Ranges(), Ranges(), Ranges()
    pool.run_many([(100, a), (0, b), (7, c)], grain=3)
    a.assert_cover(100, 3)
    assert b.seen == []
    c.assert_cover(7, 3)


def test_run_many_default_grain_per_space(pool: CPUPool) -> None:
    a, b = Ranges(), Ranges()
    pool.run_many([(5000, a), (10, b)])
    a.assert_cover(5000, default_grain(5000, 4))
    b.assert_cover(10, default_grain(10, 4))


def test_run_rows_huge_counts_pass_the_last_row(pool: CPUPool) -> None:
    # Float division made this one range: row 2**53 never reached f.
    ranges = Ranges()
    pool.run_rows(2**53 + 1, ranges, grain=2**53)
    assert sorted(ranges.seen) == [(0, 2**53), (2**53, 2**53 + 1)]
    many = Ranges()
    pool.run_many([(3 * 2**60 + 1, many), (1, many)], grain=2**60)
    assert sorted(many.seen) == [
        (0, 1), (0, 2**60), (2**60, 2**61), (2**61, 3 * 2**60), (3 * 2**60, 3 * 2**60 + 1)
    ]  # fmt: skip


def test_run_many_empty_list(pool: CPUPool) -> None:
    pool.run_many([])


def test_matvec_is_bit_identical_to_the_serial_loop(pool: CPUPool) -> None:
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((1000, 777), dtype=np.float32)
    x = rng.standard_normal(777, dtype=np.float32)
    grain = 13
    serial = np.empty(1000, dtype=np.float32)
    parallel = np.full(1000, np.nan, dtype=np.float32)

    def rows_into(out: np.ndarray) -> object:
        return lambda s, e: np.dot(weights[s:e], x, out=out[s:e])

    with threadpool_limits(1):
        for start in range(0, 1000, grain):
            rows_into(serial)(start, min(start + grain, 1000))
        pool.run_rows(1000, rows_into(parallel), grain=grain)  # type: ignore[arg-type]
    assert parallel.tobytes() == serial.tobytes()


# --- errors ---------------------------------------------------------------------------


def test_worker_exception_is_reraised_and_pool_stays_usable(pool: CPUPool) -> None:
    def f(index: int, n: int) -> None:
        if index == 1:
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom") as info:
        pool.run(f)
    assert "participant 1 of 4" in "".join(info.value.__notes__)
    ranges = Ranges()
    pool.run_rows(50, ranges, grain=5)
    ranges.assert_cover(50, 5)


def test_caller_exception_waits_for_the_workers(pool: CPUPool) -> None:
    caller_failed = threading.Event()
    order: list[str] = []

    def f(index: int, n: int) -> None:
        if index == pool.n_workers:
            caller_failed.set()
            raise ValueError("caller")
        assert caller_failed.wait(WAIT_S)
        order.append("worker")

    with pytest.raises(ValueError, match="caller"):
        pool.run(f)
    order.append("caller saw it")
    assert order == ["worker"] * 3 + ["caller saw it"]


def test_several_exceptions_come_back_as_a_group(pool: CPUPool) -> None:
    def f(index: int, n: int) -> None:
        if index in (0, 3):
            raise ValueError(f"p{index}")
        if index == 2:
            raise KeyboardInterrupt

    with pytest.raises(BaseExceptionGroup) as info:
        pool.run(f)
    group = info.value
    assert [type(e) for e in group.exceptions] == [ValueError, KeyboardInterrupt, ValueError]
    assert str(group.exceptions[2]) == "p3"
    assert all(e.__notes__ for e in group.exceptions)
    pool.run(lambda i, n: None)


def test_row_job_error_stops_handing_out_rows(pool: CPUPool) -> None:
    ranges = Ranges()

    def f(start: int, end: int) -> None:
        ranges(start, end)
        if start == 0:
            raise RuntimeError("first chunk")

    with pytest.raises(RuntimeError, match="first chunk"):
        pool.run_rows(10_000, f, grain=1)
    assert len(ranges.seen) < 10_000


# --- nesting and concurrency ----------------------------------------------------------


def test_nested_run_is_serial_in_the_calling_thread(pool: CPUPool) -> None:
    inner: list[tuple[int, int, int, int]] = []
    lock = threading.Lock()

    def inner_f(i: int, n: int) -> None:
        with lock:
            inner.append((threading.get_ident(), i, n, 0))

    def outer(index: int, n: int) -> None:
        me = threading.get_ident()
        pool.run(inner_f)
        ranges = Ranges()
        pool.run_rows(40, ranges, grain=7)
        ranges.assert_cover(40, 7)
        with lock:
            mine = sorted(i for t, i, _, _ in inner if t == me)
        assert mine == list(range(n))

    pool.run(outer)
    assert len(inner) == 16


def test_nested_call_into_another_pool_is_serial(pool: CPUPool) -> None:
    with CPUPool(1) as other:
        threads: list[set[int]] = []

        def outer(index: int, n: int) -> None:
            seen: set[int] = set()
            other.run(lambda i, m: seen.add(threading.get_ident()))
            threads.append(seen)

        pool.run(outer)
        assert all(len(s) == 1 for s in threads)


def test_concurrent_callers_take_turns(pool: CPUPool) -> None:
    lock = threading.Lock()
    running: Counter[int] = Counter()
    overlaps: list[int] = []
    totals: Counter[int] = Counter()

    def job(tag: int) -> None:
        def f(index: int, n: int) -> None:
            with lock:
                running[tag] += 1
                if any(count for other, count in running.items() if other != tag):
                    overlaps.append(tag)
                totals[tag] += 1
            with lock:
                running[tag] -= 1

        for _ in range(40):
            pool.run(f)

    threads = [threading.Thread(target=job, args=(tag,)) for tag in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive()
    assert overlaps == []
    assert totals == Counter({0: 160, 1: 160, 2: 160})


# --- lifetime -------------------------------------------------------------------------


def test_close_twice_and_use_after_close() -> None:
    p = CPUPool(2)
    threads = list(p._workers.threads)
    p.close()
    p.close()
    assert p.closed and not any(t.is_alive() for t in threads)
    with pytest.raises(PoolClosedError):
        p.run(lambda i, n: None)
    with pytest.raises(PoolClosedError):
        p.run_rows(10, lambda a, b: None)
    with pytest.raises(PoolClosedError):
        p.run_rows(0, lambda a, b: None)


def test_context_manager_closes() -> None:
    with CPUPool(1) as p:
        p.run(lambda i, n: None)
    assert p.closed


def test_close_from_inside_a_job_is_refused(pool: CPUPool) -> None:
    with pytest.raises(BaseExceptionGroup) as info:
        pool.run(lambda i, n: pool.close())
    assert all(isinstance(e, RuntimeError) for e in info.value.exceptions)
    assert not pool.closed
    pool.run(lambda i, n: None)


def test_close_waits_for_a_running_job() -> None:
    p = CPUPool(1)
    started, finish = threading.Event(), threading.Event()
    done: list[str] = []

    def f(index: int, n: int) -> None:
        if index == 0:
            started.set()
            assert finish.wait(WAIT_S)
            done.append("job")

    runner = threading.Thread(target=p.run, args=(f,))
    runner.start()
    assert started.wait(WAIT_S)
    closer = threading.Thread(target=p.close)
    closer.start()
    finish.set()
    closer.join(WAIT_S)
    runner.join(WAIT_S)
    assert done == ["job"] and p.closed


def test_forgotten_pool_is_finalized() -> None:
    p = CPUPool(2)
    threads = list(p._workers.threads)
    del p
    gc.collect()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive()


def run_script(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_forgotten_pool_does_not_block_exit() -> None:
    done = run_script("""
        import hwpool
        pool = hwpool.CPUPool(2)
        pool.run(lambda i, n: None)
        print("ok")
    """)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_fork_child_gets_fresh_workers() -> None:
    done = run_script("""
        import os, threading
        import hwpool
        pool = hwpool.CPUPool(2)
        parent = list(pool._workers.threads)
        pool.run(lambda i, n: None)
        pid = os.fork()
        if pid == 0:
            seen = set()
            lock = threading.Lock()
            def f(i, n):
                with lock:
                    seen.add(i)
            pool.run(f)
            ok = seen == {0, 1, 2} and all(t.is_alive() for t in pool._workers.threads)
            ok = ok and not set(pool._workers.threads) & set(parent)
            rows = []
            pool.run_rows(100, lambda a, b: rows.extend(range(a, b)), grain=3)
            ok = ok and sorted(rows) == list(range(100))
            pool.close()
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        pool.run(lambda i, n: None)
        pool.close()
        print(os.waitstatus_to_exitcode(status))
    """)
    assert (done.returncode, done.stdout.strip()) == (0, "0"), done.stderr


# --- bad arguments --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_workers": -1}, ValueError, "n_workers"),
        ({"n_workers": "2"}, TypeError, "n_workers"),
        ({"n_workers": True}, TypeError, "n_workers"),
        ({"n_workers": 1, "spin": -1}, ValueError, "spin"),
        ({"n_workers": 1, "spin": 1.5}, TypeError, "spin"),
        ({"n_workers": "1"}, TypeError, r"n_workers must be an int, got '1' \(str\)"),
        ({"n_workers": 2.0}, TypeError, "n_workers"),
        ({"n_workers": 1, "spin": True}, TypeError, "spin"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CPUPool(**kwargs)  # type: ignore[arg-type]


def test_numpy_integers_are_counts() -> None:
    with CPUPool(np.int64(2), spin=np.uint8(3)) as p:  # type: ignore[arg-type]
        assert (p.n_workers, p.spin) == (2, 3) and type(p.n_workers) is int
        ranges = Ranges()
        p.run_rows(np.int32(10), ranges, grain=np.int16(4))  # type: ignore[arg-type]
        ranges.assert_cover(10, 4)


def test_bad_job_arguments_run_nothing(pool: CPUPool) -> None:
    called = Ranges()
    cases: list[tuple[object, type, str]] = [
        (lambda: pool.run(42), TypeError, "f must be callable"),  # type: ignore[arg-type]
        (lambda: pool.run_rows(-1, called), ValueError, "rows must be >= 0, got -1"),
        (lambda: pool.run_rows(2.5, called), TypeError, "rows"),  # type: ignore[arg-type]
        (lambda: pool.run_rows(3, None), TypeError, "f must be callable"),  # type: ignore[arg-type]
        (lambda: pool.run_rows(3, called, grain=0), ValueError, "grain must be >= 1, got 0"),
        (lambda: pool.run_rows(3, called, grain=2.0), TypeError, "grain"),  # type: ignore[arg-type]
        (lambda: pool.run_many([(5, called), (-2, called)]), ValueError, "rows"),
        (lambda: pool.run_many([(5, called), (3,)]), TypeError, r"jobs\[1\]"),  # type: ignore[list-item]
        (lambda: pool.run_many("ab"), TypeError, "jobs"),  # type: ignore[arg-type]
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()  # type: ignore[operator]
    assert called.seen == []


# --- cursor ---------------------------------------------------------------------------


@pytest.mark.parametrize("locked", [False, True])
def test_cursor_hands_out_each_number_once(locked: bool) -> None:
    cursor = Cursor(locked=locked)
    got: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4, timeout=WAIT_S)

    def take(slot: list[int]) -> None:
        start.wait()
        slot.extend(cursor.next() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(slot,)) for slot in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert sorted(n for slot in got for n in slot) == list(range(8000))


def test_public_names_are_exported() -> None:
    for name in ("CPUPool", "CPUTopology", "NumaNode", "cpu_topology", "effective_threads"):
        assert name in hwpool.__all__ and getattr(hwpool, name) is not None
    assert "set_threads" in hwpool.__all__
