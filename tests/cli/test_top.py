"""``hwpool top``: its screen as a pure function of a status report, and the real command.

The renderer (``_top_view.render``) is tested directly on reports; the command against a real
``hwpool serve`` holding leases and waiters: in a pseudo-terminal (curses, ``q`` quits, a
resize redraws), printing to a pipe (one snapshot per interval), with ``--once``, and with a
bad ``--interval``.
"""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hostserver import BOUND, ENV, Server, run_cli, status_of
from hwpool._cli._top_view import bar, render, why_waiting
from hwpool._core._capacity import UNITS_PER_GPU
from rawpeers import LinePeer

HALF = UNITS_PER_GPU // 2


# ----------------------------------------------------------------- the renderer, directly
def report(**changes: Any) -> dict[str, Any]:
    """A status report as ``hwpool status --json`` gives it: 2 GPUs, GPU 0 half leased to
    alice's ``train``, bob waiting for 2 whole GPUs."""
    base: dict[str, Any] = {
        "socket": "/run/hwpool/hwpool.sock",
        "server": {"pid": 10, "uid": 0, "user": "root", "version": "hwpool 1", "uptime_s": 75.0,
                   "recovering_s": 0.0, "journal_error": None},
        "sized_in_memory": False,
        "gpus": [
            {"index": 0, "device": "GPU-aaa", "free": 0.5, "free_mib": None, "total_mib": None},
            {"index": 1, "device": "GPU-bbb", "free": 1.0, "free_mib": None, "total_mib": None},
        ],
        "leases": [{"id": 3, "uid": 1000, "user": "alice", "pid": 4405, "held": [[0, 0.5]],
                    "held_mib": None, "held_s": 7200.0, "name": "train", "command": None}],
        "waiting": [{"position": 1, "id": 4, "uid": 1001, "user": "bob", "pid": 77, "count": 2,
                     "fraction": 1.0, "memory_mib": None, "reserved": [], "waited_s": 3.0,
                     "name": None, "command": None, "held": None, "account": None}],
        "owners": [], "owners_left_out": 0,
        "counters": {"granted": 5, "released": 4, "cancelled": 1, "timed_out": 0},
    }  # fmt: skip
    base.update(changes)
    return base


def test_a_gpu_shows_its_leased_bar_and_the_lease_on_it() -> None:
    lines = render(report(), 110, 40)  # bars of (110 - 50) // 3 = 20 cells
    gpu0 = next(i for i, line in enumerate(lines) if line.startswith("GPU 0"))
    assert f"leased {bar(0.5, 20)} 0.50" in lines[gpu0]
    assert lines[gpu0 + 1].split() == [
        "#3", "alice", "pid", "4405", "[train]", "0.50", "of", "it,", "held", "2.0", "h"
    ]  # fmt: skip
    assert lines[gpu0 + 2].startswith("GPU 1")  # no lease on GPU 1
    assert all(len(line) <= 110 for line in lines)


def test_a_waiter_shows_its_owner_and_why_it_waits() -> None:
    lines = render(report(), 200, 40)
    line = next(x for x in lines if "#4" in x)
    assert "1. #4 bob pid 77: 2 whole GPUs, waiting 3.0 s" in line
    assert line.endswith("-- no room: 1 GPU with a whole GPU free")


@pytest.mark.parametrize(
    ("server", "waiter", "why"),
    [
        ({"journal_error": "disk full"}, {}, "the server cannot write its journal"),
        ({"recovering_s": 2.0}, {}, "the server is recovering after a restart"),
        ({"draining": "driver update"}, {}, "the server is draining: driver update"),
        ({}, {"held": "bob holds 2 GPUs, his limit"}, "held by its owner's limits: bob holds"),
        ({}, {"reserved": [0]}, "GPU 0 reserved for it, until the leases there end"),
        ({}, {"count": 1, "fraction": 0.25}, "behind the requests ahead of it"),
    ],
)
def test_why_a_request_waits(server: dict[str, Any], waiter: dict[str, Any], why: str) -> None:
    rep = report()
    rep["server"].update(server)
    rep["waiting"][0].update(waiter)
    assert why_waiting(rep["waiting"][0], rep).startswith(why)


def test_a_drained_server_or_gpu_is_said_at_the_top() -> None:
    rep = report()
    rep["gpus"][1]["draining"] = "fan\x1b"
    assert "! GPU 1 draining: fan\\x1b" in render(rep, 200, 40)
    rep["server"]["draining"] = "driver update"
    rep["gpus"][0]["draining"] = rep["gpus"][1]["draining"] = "driver update"
    lines = render(rep, 200, 40)
    assert "! draining, nothing new is granted: driver update" in lines
    assert not [line for line in lines if line.startswith("! GPU")]


def test_a_waiter_shows_the_servers_reason_and_estimated_start() -> None:
    rep = report()
    rep["waiting"][0].update(reason="priority", reason_detail="2 waiting ahead",
                             estimated_start=None)  # fmt: skip
    line = next(x for x in render(rep, 200, 40) if "#4" in x)
    assert line.endswith("-- no room: 1 GPU with a whole GPU free [priority; start unknown]")
    rep["waiting"][0]["estimated_start"] = time.time() + 185
    line = next(x for x in render(rep, 200, 40) if "#4" in x)
    assert "[priority; starts in about 3 min (" in line


def test_a_small_window_gets_the_first_lines_and_how_many_more() -> None:
    full = render(report(), 30, None)
    lines = render(report(), 30, 4)
    assert len(lines) == 4
    assert all(len(line) <= 30 for line in lines)
    assert lines[:3] == full[:3]
    assert lines[3].startswith(f"... {len(full) - 3} more lines")


def test_what_another_user_wrote_is_escaped() -> None:
    rep = report()
    rep["leases"][0]["name"] = "x\x1b[2Jy"
    rep["waiting"][0]["user"] = "b\nob"
    text = "\n".join(render(rep, 200, 40))
    assert "\x1b" not in text
    assert "[x\\x1b[2Jy]" in text
    assert "b\\nob" in text


def test_without_live_fields_no_memory_bar_and_no_outside_section() -> None:
    text = "\n".join(render(report(), 200, 40))
    assert " mem " not in text
    assert "util" not in text
    assert "outside the queue" not in text


def test_the_live_gpu_fields_are_shown_when_present() -> None:
    """The fields a watching server adds (docs/observability.md): memory and utilisation
    bars, memory withheld, a lease's use and over-lease flag, processes outside the queue."""
    rep = report(
        gpu_state=[
            {"gpu": 0, "uuid": "GPU-aaa", "total_mib": 81920, "used_mib": 20480,
             "utilization": 50, "withheld_mib": 4096},
            {"gpu": 1, "uuid": "GPU-bbb", "total_mib": None, "used_mib": None,
             "utilization": None, "withheld_mib": 0},
        ],
        outside=[{"pid": 999, "uid": 1002, "user": "carol", "gpu": 0, "used_mib": 4096}],
        outside_left_out=2,
    )  # fmt: skip
    rep["leases"][0].update(used_mib=16384, over_lease=True, allowed_mib=10240)
    lines = render(rep, 200, 40)
    gpu0 = next(line for line in lines if line.startswith("GPU 0"))
    assert f"mem {bar(0.25, 30)} 20GiB/80GiB" in gpu0
    assert f"util {bar(0.5, 30)}  50%" in gpu0
    assert "withheld 4GiB" in gpu0
    assert "mem unknown" in next(line for line in lines if line.startswith("GPU 1"))
    lease = next(line for line in lines if "#3" in line)
    assert lease.endswith("uses 16GiB OVER its lease of 10GiB")
    assert "outside the queue (3, 2 not shown):" in lines
    assert "  pid 999 carol on GPU 0: 4GiB" in lines


def test_a_server_sized_in_memory_shows_mib() -> None:
    rep = report(sized_in_memory=True)
    rep["gpus"][0].update(free_mib=40960, total_mib=81920)
    rep["leases"][0]["held_mib"] = [[0, 40960]]
    rep["waiting"][0].update(count=1, fraction=None, memory_mib=65536)
    lines = render(rep, 200, 40)
    assert "(40GiB free)" in lines[2]
    assert "40GiB (0.50)" in next(line for line in lines if "#3" in line)
    assert next(line for line in lines if "#4" in line).endswith(
        "-- no room: 0 GPUs with 64GiB free"
    )


# ----------------------------------------------------------------- the command, for real
@pytest.fixture
def busy_server() -> Iterator[Server]:
    """A 1-GPU server: half of it leased as ``trainjob``, the other half as ``evaljob``, and
    ``waitjob`` (a whole GPU) waiting."""
    directory = Path(tempfile.mkdtemp(prefix="hwt", dir="/tmp"))
    server = Server(directory / "s.sock", "--gpus", "1").ready()
    holder = LinePeer(server.socket)
    try:
        assert holder.acquire(1, units=HALF, name="trainjob") == "granted"
        assert holder.acquire(2, units=HALF, name="evaljob") == "granted"
        assert holder.acquire(3, units=UNITS_PER_GPU, name="waitjob") == "queued"
        yield server
    finally:
        holder.close()
        server.kill()
        shutil.rmtree(directory, ignore_errors=True)


def test_top_once_prints_the_leases_and_the_waiter(
    busy_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # off a terminal, the print is as wide as COLUMNS
    code, out, err = run_cli("top", "--socket", str(busy_server.socket), "--once")
    assert (code, err) == (0, "")
    leases = {x["name"]: x["id"] for x in status_of(busy_server.socket)["leases"]}
    assert f"#{leases['trainjob']} " in out
    assert "[trainjob]" in out
    assert "[evaljob]" in out
    waiter = next(line for line in out.splitlines() if "[waitjob]" in line)
    assert waiter.strip().startswith("1. #")
    assert "-- GPU 0 reserved for it, until the leases there end" in waiter
    assert waiter.endswith("[resources; start unknown]")  # no lease has a limit


def test_top_into_a_pipe_prints_one_snapshot_per_interval(busy_server: Server) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwpool", "top", "--socket", str(busy_server.socket),
         "--interval", "0.05"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        text = _read_until(proc.stdout.fileno(), lambda t: t.count(b"[waitjob]") >= 3)
    finally:
        proc.kill()
        proc.communicate(timeout=BOUND)
    snapshots = [s for s in text.decode().split("\n\n") if s.strip()][:3]
    assert all(s.startswith("hwpool top ") and "[trainjob]" in s for s in snapshots)
    assert "\x1b" not in text.decode()  # no terminal control in a pipe


def test_top_keeps_the_last_screen_and_says_why_when_the_server_goes(
    busy_server: Server,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwpool", "top", "--socket", str(busy_server.socket),
         "--interval", "0.05"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**ENV, "COLUMNS": "400"},
    )  # fmt: skip
    said = b"no answer now"
    try:
        assert proc.stdout is not None
        _read_until(proc.stdout.fileno(), lambda t: b"[trainjob]" in t)
        busy_server.kill()
        text = _read_until(
            proc.stdout.fileno(), lambda t: said in t and b"\n\n" in t[t.index(said) :]
        )
        assert proc.poll() is None  # it goes on asking
    finally:
        proc.kill()
        proc.communicate(timeout=BOUND)
    last = next(x for x in text.decode().split("\n\n") if "no answer now" in x)
    assert "(no answer now, showing the last one: " in last
    assert "[trainjob]" in last


def test_top_with_no_server_says_so_and_exits_1(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    code, out, err = run_cli("top", "--socket", str(directory / "none.sock"), "--once")
    assert code == 1
    assert out == ""
    assert err.startswith("hwpool: error: ") and "none.sock" in err


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf"])
def test_a_bad_interval_is_refused_naming_it(value: str) -> None:
    code, out, err = run_cli("top", "--interval", value, "--once")
    assert code == 2
    assert out == ""
    assert f"argument --interval: must be a number of seconds > 0, got {value!r}" in err


def _read_until(fd: int, done: Any, timeout: float = BOUND) -> bytes:
    """Bytes read from ``fd`` until ``done(bytes so far)`` (bounded)."""
    got = b""
    deadline = time.monotonic() + timeout
    while not done(got):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"never seen; got {got[-2000:]!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pty's other side closed
                chunk = b""
            if not chunk:
                raise AssertionError(f"closed before it was seen; got {got[-2000:]!r}")
            got += chunk
    return got


def _set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def test_top_in_a_terminal_shows_the_leases_redraws_on_resize_and_quits_on_q(
    busy_server: Server,
) -> None:
    main, side = os.openpty()
    _set_size(side, 40, 120)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hwpool", "top", "--socket", str(busy_server.socket),
         "--interval", "0.2"],
        stdin=side, stdout=side, stderr=side, env={**ENV, "TERM": "xterm-256color"},
        start_new_session=True,
    )  # fmt: skip
    os.close(side)
    try:
        _read_until(main, lambda t: b"[trainjob]" in t and b"[waitjob]" in t)
        _set_size(main, 4, 120)  # too small for everything: it says how much is left out
        os.kill(proc.pid, signal.SIGWINCH)
        _read_until(main, lambda t: b"more lines" in t)
        os.write(main, b"q")
        assert proc.wait(BOUND) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(BOUND)
        os.close(main)
