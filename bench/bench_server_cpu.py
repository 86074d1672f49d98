"""The host server's own CPU per acquire + release, against a bare echo's per line, and where
it goes.

A real ``hwpool serve --gpus 8`` and an asyncio echo server run as child processes; one
client does ``acquire_blocking(0.5)`` + ``release`` on ``hwpool.connect()`` ``--pairs`` times
(the release is not waited for: the next acquire often arrives in the same read, as in use),
and the echo gets the same number of blocking round trips of an ``acquire`` line. What each
server process spent, user and system CPU together, is read from ``/proc/PID/stat`` before
and after, so the client's CPU is not counted; each figure is the best of ``--rounds``.

Aim (issue 37): the server's CPU per pair at most 50 us. The echo's CPU per line is the floor
of any asyncio server on this machine (its socket I/O and loop turns), printed beside it.

``--profile FILE`` runs the server under cProfile instead (its figures are then inflated by
the profiler) and prints where its time went, by part: the journal, JSON decoding and
encoding, the host state and the core, the log, the event loop and socket I/O. Run:
``python bench/bench_server_cpu.py [--quick] [--pairs N] [--rounds R] [--profile FILE]
[--baseline-src OTHER_CHECKOUT/src]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import pstats
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hwpool
from _hostserver import echo_server, host_server, short_dir, wait_until_listening
from hwpool import UNITS_PER_GPU
from hwpool._wire._protocol import Acquire, encode

GPUS = 8
LINE = encode(Acquire(12345, 1, UNITS_PER_GPU // 2, True))
TICK = os.sysconf("SC_CLK_TCK")  # /proc counts CPU in these (10 ms): runs must be long
ECHO_LINES = 10  # echo round trips per acquire + release timed

# Which part of the server a profiled function belongs to, by its file and name (the first
# match wins); what matches none is the event loop (asyncio, its selector, the socket calls).
# A builtin's time goes to the parts of its callers.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("journal", ("_server/_journal.py",)),
    ("log lines (their text, their write)", (":say", ":flush_log", ":_what", ":_job")),
    (
        "I/O layer (_server.py, framing)",
        ("_server/_server.py", ":feed", "_framing.py:_check", "_protocol.py:_check"),
    ),
    ("JSON decoding, validation, encoding", ("/_wire/", "json/", "_json")),
    ("host state (books, admission)", ("_server/_host_",)),
    ("scheduler core", ("/_core/",)),
    ("peer checks", ("_listen.py", "_procs.py", "_safety.py")),
]


def part_of(file: str, function: str) -> str:
    """The part of :data:`PARTS` that ``function`` of ``file`` belongs to."""
    where = f"{file}:{function}"
    return next((name for name, keys in PARTS if any(k in where for k in keys)), "event loop")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far, in seconds (clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def server_pairs(path: Path, n: int) -> None:
    pool = hwpool.connect(path)
    try:
        for _ in range(n):
            pool.release(pool.acquire_blocking(0.5), 0.5)
    finally:
        pool.close()


def echo_lines(path: Path, n: int) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(path))
    try:
        for _ in range(n):
            sock.sendall(LINE)
            sock.recv(65536)
    finally:
        sock.close()


def cpu_per_call(pid: int, run: Callable[[], None], n: int) -> float:
    """Seconds of ``pid``'s CPU per call while ``run`` makes ``n`` calls."""
    before = cpu_seconds(pid)
    run()
    return (cpu_seconds(pid) - before) / n


def echo_pid(path: Path) -> int:
    """The pid of the process listening on ``path`` (the echo server: SO_PEERCRED)."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(path))
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return int.from_bytes(creds[:4], sys.byteorder)
    finally:
        sock.close()


def measure(n: int, rounds: int, baseline: Path | None = None) -> dict[str, float]:
    """Best-of-``rounds`` server CPU per pair and echo CPU per line, interleaved; with
    ``baseline`` (another checkout's ``src``), that checkout's server too."""
    found: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        echo = stack.enter_context(echo_server())
        echo_process = echo_pid(echo)
        servers = {"server": stack.enter_context(host_server(GPUS))}
        if baseline is not None:
            servers["baseline"] = stack.enter_context(host_server(GPUS, src=baseline))
        for path, _ in servers.values():
            server_pairs(path, n // 10)  # warm-up
        echo_lines(echo, n // 10)
        for _ in range(rounds):
            for name, (path, proc) in servers.items():
                used = cpu_per_call(proc.pid, lambda path=path: server_pairs(path, n), n)
                found.setdefault(name, []).append(used)
            lines = n * ECHO_LINES  # an echo costs little: more of them, for the clock ticks
            used = cpu_per_call(echo_process, lambda k=lines: echo_lines(echo, k), lines)
            found.setdefault("echo", []).append(used)
    return {name: min(values) for name, values in found.items()}


class _Transport(asyncio.Transport):
    """What the server writes to, in memory: no socket, no system call."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out.append(bytes(data))

    def get_extra_info(self, name: str, default: object = None) -> object:
        return None  # no socket: the peer is set by hand

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


IN_PROCESS = {
    None: "all of it",
    "journal": "without the journal (its records and write)",
    "log": "without the log's calls (its text still made)",
}


def in_process(n: int, without: str | None = None) -> float:
    """Seconds of CPU per pair of the server's own code, in this process, fed the lines of
    ``n`` pairs (each release with the next acquire, as they arrive) through a transport in
    memory; ``without`` ``journal`` or ``log``: that part's writes (or calls) made no-ops."""
    from hwpool._host._detect import GPUInfo  # noqa: PLC0415 (the server's private parts)
    from hwpool._server import _journal, _server  # noqa: PLC0415
    from hwpool._wire._protocol import Release  # noqa: PLC0415

    with short_dir() as directory:
        gpus = tuple(GPUInfo(i, f"logical{i}") for i in range(GPUS))
        config = _server.ServeConfig(directory / "hwpool.sock", gpus, watch_interval_s=0)
        with open(os.devnull, "w") as log:
            server = _server._Server(config, log)
            if without == "log":
                server.say = server.state.log = lambda line: None  # type: ignore[method-assign]
            acquires = [
                encode(Acquire(2 * k + 1, 1, UNITS_PER_GPU // 2, True)) for k in range(n + 1)
            ]
            releases = [encode(Release(2 * k + 2, 2 * k + 1)) for k in range(n)]
            write = _journal.JournalFile.write
            if without == "journal":
                _journal.JournalFile.write = lambda *args: None  # type: ignore[method-assign]
            try:
                return asyncio.run(_pairs_in_process(server, acquires, releases))
            finally:
                _journal.JournalFile.write = write  # type: ignore[method-assign]


async def _pairs_in_process(server: Any, acquires: list[bytes], releases: list[bytes]) -> float:
    from hwpool._server import _server  # noqa: PLC0415
    from hwpool._wire._protocol import PROTOCOL_VERSION, Hello  # noqa: PLC0415

    server.loop = asyncio.get_running_loop()
    server._loop_thread = threading.get_ident()
    server.recover()
    server.flush()
    conn, transport = _server._Connection(server), _Transport()
    conn.peer = _server.Peer(os.getpid(), os.getuid(), os.getgid())  # (no socket to ask)
    conn.connection_made(transport)
    conn.data_received(encode(Hello(PROTOCOL_VERSION, "bench")))
    conn.data_received(acquires[0])
    await asyncio.sleep(0)  # its turn: journaled, answered
    start = time.process_time()
    for release, acquire in zip(releases, acquires[1:], strict=True):
        conn.data_received(release + acquire)
        await asyncio.sleep(0)
    used = time.process_time() - start
    assert transport.out[-1].startswith(b'{"op":"granted"'), transport.out[-1]
    return used / len(releases)


PROFILED_SERVER = """
import cProfile, signal, sys, time
from hwpool._cli._main import main
profiler = cProfile.Profile(time.thread_time)  # CPU time: waiting in epoll is not counted
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
signal.signal(signal.SIGUSR2, lambda *_: (profiler.disable(), profiler.dump_stats(sys.argv[1])))
sys.exit(main(sys.argv[2:]))
"""

# Functions whose time with what they call (cumulative) is shown per pair, by name.
ENTRY_POINTS = [
    ("data_received", "a read: framing and serving its lines"),
    ("handle", "one line: decode, then the host state"),
    ("decode_client", "JSON decoding and validation"),
    ("acquire", "HostState.acquire (admission, the core)"),
    ("release", "HostState.release (the core, the books)"),
    ("flush", "one turn's journal write and replies"),
    ("write", "the journal's write (and each transport write)"),
    ("encode", "encoding the replies"),
    ("say", "log lines"),
    ("flush_log", "the log's write"),
    ("_run_once", "the event loop's turns, all included"),
]


def profile(n: int, out: Path, src: Path | None = None) -> str:
    """Run ``n`` pairs against a server whose loop thread is profiled (CPU time, only while
    they run); its own time by part, a few functions with what they call, and the top
    functions by their own time. ``src``: the ``src`` folder of another checkout to run the
    server from."""
    with short_dir() as directory:
        path = directory / "hwpool.sock"
        args = [sys.executable, "-c", PROFILED_SERVER, str(out), "serve", "--socket", str(path),
                "--gpus", str(GPUS)]  # fmt: skip
        env = None if src is None else {**os.environ, "PYTHONPATH": str(src)}
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)  # fmt: skip
        try:
            wait_until_listening(path, proc)
            server_pairs(path, n // 10)  # warm-up, not profiled
            proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)  # the handler runs on the server's next turn
            used = cpu_seconds(proc.pid)
            server_pairs(path, n)
            used = cpu_seconds(proc.pid) - used
            proc.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    raw = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())  # own time of every function
    by_part: dict[str, float] = {}
    for (file, _, function), entry in raw.items():
        if file == "~":  # a builtin (len, dict.get, a socket's send): its callers' time
            callers = entry[4]
            spent = sum(call[2] for call in callers.values()) or 1.0
            for (c_file, _, c_function), call in callers.items():
                part = part_of(c_file, c_function)
                by_part[part] = by_part.get(part, 0.0) + entry[2] * call[2] / spent
            continue
        part = part_of(file, function)
        by_part[part] = by_part.get(part, 0.0) + entry[2]
    lines = [
        f"profiled: {n} pairs; server CPU {used / n * 1e6:.0f} us per pair under the profiler,"
        f" {total / n * 1e6:.0f} us of it in the profiled loop thread",
        "own time by part (per pair, and its share):",
    ]
    for part, seconds in sorted(by_part.items(), key=lambda item: -item[1]):
        lines.append(f"  {part:38s} {seconds / n * 1e6:7.1f} us  {seconds / total:6.1%}")
    lines.append("with what they call (per pair, summed over functions of that name):")
    for name, what in ENTRY_POINTS:
        cumulative = sum(e[3] for (_, _, f), e in raw.items() if f == name)
        lines.append(f"  {cumulative / n * 1e6:7.1f} us  {name}: {what}")
    lines.append("top functions by own time (per pair):")
    top = sorted(raw.items(), key=lambda item: -item[1][2])[:30]
    for (file, line, function), entry in top:
        lines.append(f"  {entry[2] / n * 1e6:7.2f} us  {entry[1] / n:5.2f} calls  "
                     f"{Path(file).name}:{line}({function})")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark and return its report (also printed when run as a script)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred pairs (a smoke run)")
    parser.add_argument("--pairs", type=int, default=5000, help="pairs per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the best is kept)")
    parser.add_argument("--profile", type=Path, help="profile the server into this file")
    parser.add_argument("--in-process", action="store_true", help="the server's code alone, "
                        "in this process, fed through a transport in memory (no sockets), "
                        "also without the journal's writes and without the log")  # fmt: skip
    parser.add_argument("--baseline-src", type=Path, help="also measure the server of the "
                        "hwpool checkout whose src folder this is, in the same run (with "
                        "--profile: profile that server instead)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs, args.rounds = 300, 1
    if args.in_process:
        rows = []
        for without in (None, "journal", "log"):
            best = min(in_process(args.pairs, without) for _ in range(args.rounds)) * 1e6
            rows.append(f"  {IN_PROCESS[without]:46s} per pair {best:7.1f} us")
        report = "\n".join(["hwpool serve's code, in-process (no sockets), best of "
                             f"{args.rounds} rounds of {args.pairs}", *rows])  # fmt: skip
        print(report)
        return report
    if args.profile is not None:
        report = profile(args.pairs, args.profile, args.baseline_src)
        print(report)
        return report
    cpu = measure(args.pairs, args.rounds, args.baseline_src)
    server, echo = cpu["server"] * 1e6, cpu["echo"] * 1e6
    lines = [
        f"hwpool serve's own CPU  (Python {platform.python_version()}, {platform.machine()}, "
        f"best of {args.rounds} rounds of {args.pairs})",
        f"  bare echo server, per line              {echo:7.1f} us",
        f"  hwpool serve, per acquire + release     {server:7.1f} us  "
        f"({server / max(echo, 1e-3):.1f}x the echo; aim <= 50 us)",
    ]  # fmt: skip
    if "baseline" in cpu:
        base = cpu["baseline"] * 1e6
        lines.append(f"  baseline ({args.baseline_src}), per pair  {base:7.1f} us  "
                     f"(this one: {server / base:.2f}x the baseline)")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
