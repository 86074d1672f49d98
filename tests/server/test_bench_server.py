"""The host-server benchmarks run end to end (smoke runs: their figures are not checked)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))  # for their shared helper, _hostserver
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_round_trip_bench_prints_every_contender(capsys: pytest.CaptureFixture[str]) -> None:
    table = load("bench_server").main(["--quick"])
    labels = ("bare echo", "reader thread", "hwpool serve", "in-process GPUPool", "--gpu-memory")
    waiting = ("await acquire that waits", "a request that waits vs one granted at once")
    pipelined = ("8 in flight on one socket", "8 in flight, await acquire", "pipelined (8 in")
    for label in (*labels, *waiting, *pipelined, "memory server vs fraction server"):
        assert label in table
    assert table in capsys.readouterr().out


def test_cpu_bench_counts_the_server_against_the_echo(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bench = load("bench_server_cpu")
    table = bench.main(["--quick"])
    assert "bare echo server, per line" in table and "hwpool serve, per acquire + release" in table
    report = bench.main(["--quick", "--profile", str(tmp_path / "server.prof")])
    for part in ("journal", "scheduler core", "JSON decoding", "event loop", "flush"):
        assert part in report
    alone = bench.main(["--quick", "--in-process"])
    assert "all of it" in alone and "without the journal" in alone
    assert table in capsys.readouterr().out


def test_load_bench_checks_what_is_left(capsys: pytest.CaptureFixture[str]) -> None:
    table = load("bench_server_load").main(["--quick"])
    assert "no lease or waiter left" in table and "grants/s" in table and "RSS" in table
    assert table in capsys.readouterr().out


def test_flood_bench_times_the_others_during_and_after_a_flood(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = load("bench_server_flood").main(["--quick"])
    for label in ("alone", "during the flood", "as its waiters go", "max round trip"):
        assert label in table
    assert table in capsys.readouterr().out


def test_load_bench_kills_a_client_that_already_exited_without_error() -> None:
    # A client may finish its work between the check of its progress and its SIGKILL, and be
    # reaped meanwhile (multiprocessing reaps finished children whenever it starts another):
    # os.kill(pid) then raised ProcessLookupError and ended the benchmark.
    bench = load("bench_server_load")
    ctx = multiprocessing.get_context("fork")
    slot = bench._Slot(1, ctx.RawArray("d", 1), ctx.Value("i", 0, lock=False))
    slot.proc = ctx.Process(target=int)  # exits at once
    slot.proc.start()
    slot.proc.join()  # reaped: its pid is gone
    assert bench._kill(slot) is False  # not killed: it had finished
    live = ctx.Process(target=time.sleep, args=(60,))
    live.start()
    slot.proc = live
    assert bench._kill(slot) is True
    assert not live.is_alive()
