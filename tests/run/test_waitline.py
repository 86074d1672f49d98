"""The status line: on a terminal, updated in place while waiting; on a pipe, nothing of it."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import hwpool
from hostserver import BOUND, ENV, Server
from hwpool._cli._waitline import where_in_queue
from hwpool._wire._protocol import StatusReply, WaiterRecord
from interactive import interactive
from runproc import eventually, waiting_pids


def read_until(fd: int, fragment: str, seen: list[str]) -> None:
    """Read the terminal into ``seen`` until ``fragment`` shows (bounded)."""
    deadline = time.monotonic() + BOUND
    while fragment not in "".join(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"never showed {fragment!r}: {''.join(seen)!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                seen.append(os.read(fd, 4096).decode())
            except OSError:  # the other end closed
                break


def sockets_of(pid: int) -> int:
    """How many sockets process ``pid`` has open."""
    fds = Path(f"/proc/{pid}/fd")
    return sum(os.readlink(fds / fd).startswith("socket:") for fd in os.listdir(fds))


def test_a_terminal_shows_the_queue_position_in_place(
    start_server: Callable[..., Server], sockdir: Path
) -> None:
    server = start_server("--gpus", "1")
    master, slave = os.openpty()
    try:
        with hwpool.connect(server.socket) as pool, pool.lease(1.0):
            proc = subprocess.Popen(  # interactive: the SIGINT below must reach it
                interactive([sys.executable, "-m", "hwpool", "run", "--socket",
                             str(server.socket), "--gpus", "0.5", "--", "true"]),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave, env=ENV,
            )  # fmt: skip
            seen: list[str] = []
            read_until(master, "1st of 1 in the queue, reserves GPU 0", seen)
            eventually(lambda: waiting_pids(server.socket) == [proc.pid], "it waits")
            # One connection for the request and the line: a queued job is one of the
            # connections its user may have, not two (it was two, a flood of queued jobs
            # filled the cap at half its size).
            assert sockets_of(proc.pid) == 1
            proc.send_signal(signal.SIGINT)
            assert proc.wait(BOUND) == 130
            read_until(master, "withdrawn", seen)
    finally:
        os.close(slave)
        os.close(master)
    text = "".join(seen)
    line = r"\rhwpool run: waiting \d+ s for 0.5 of a GPU: 1st of 1 in the queue, reserves GPU 0"
    # Why it waits, and when it should start: the lease has no limit, so nothing bounds it.
    assert re.search(line + r" \(resources; start unknown\)\x1b\[K", text), text
    assert text.rstrip().endswith("withdrawn")


def test_the_line_says_why_it_waits_and_when_it_should_start() -> None:
    soon = time.time() + 125
    waiters = (
        WaiterRecord(1, 0, 11, 1, 5, (0,), 1.0, reason="resources", estimated_start=soon),
        WaiterRecord(2, 0, 22, 1, 5, (), 1.0, reason="priority", reason_detail="1 ahead"),
    )
    reply = StatusReply(1, (0,), (), waiters, 0, 0, 0, 0, 0.0, 1.0)
    assert where_in_queue(reply, 11).startswith(
        ": 1st of 2 in the queue, reserves GPU 0 (resources; starts in about 2 min ("
    )
    assert where_in_queue(reply, 22) == ": 2nd of 2 in the queue (priority; start unknown)"
    older = StatusReply(1, (0,), (), (WaiterRecord(1, 0, 11, 1, 5, (), 1.0),), 0, 0, 0, 0, 0, 1)
    assert where_in_queue(older, 11) == ": 1st of 1 in the queue"  # a server without reasons
