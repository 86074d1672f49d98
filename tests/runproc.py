"""Real ``hwpool run`` processes for the tests (tests/run): start one, wait for what it did.

Each runs ``python tests/run/job.py DIR NAME WORDS...`` under ``hwpool run``; every wait is
bounded, and orderings are proven with the files the job writes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostserver import BOUND, ENV, Server, status_of

JOB = str(Path(__file__).parent / "run" / "job.py")


class Run:
    """One ``hwpool run [OPTIONS] -- python job.py DIR NAME WORDS...`` process."""

    def __init__(
        self, server: Server | Path, directory: Path, name: str, *words: str,
        options: tuple[str, ...] = (), env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        """``launcher``: a command that runs ``hwpool run ...`` (its arguments follow)."""
        socket = server.socket if isinstance(server, Server) else server
        where = ("--socket", str(socket)) if isinstance(server, Server) else ()
        self.argv = [sys.executable, JOB, str(directory), name, *words]
        self.directory, self.name = directory, name
        self.proc = subprocess.Popen(
            [*launcher, sys.executable, "-m", "hwpool", "run", *where, *options, "--", *self.argv],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**(env or ENV), "PYTHONFAULTHANDLER": "1"},
        )  # fmt: skip
        self.socket = socket

    @property
    def pid(self) -> int:
        return self.proc.pid

    def finish(self) -> tuple[int, str]:
        """Its exit status and stderr (bounded: past BOUND it is made to dump the stack of
        every thread, through faulthandler, and the test fails showing where it hung)."""
        try:
            _, err = self.proc.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            _, err = self.proc.communicate(timeout=BOUND)
            raise AssertionError(f"hwpool run did not exit within {BOUND} s:\n{err}") from None
        return self.proc.returncode, err

    def started(self) -> dict[str, Any]:
        """What the job saw when it started (waits for it)."""
        path = self.directory / f"{self.name}.started"
        eventually(path.exists, f"{self.name} started", self)
        found: dict[str, Any] = json.loads(path.read_text())
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=BOUND)


def eventually(check: Callable[[], object], what: str, run: Run | None = None) -> None:
    """Wait (bounded) until ``check()`` is true; fail with what was awaited."""
    deadline = time.monotonic() + BOUND
    while not check():
        if run is not None and run.proc.poll() is not None:
            _, err = run.proc.communicate()
            raise AssertionError(f"{what}: hwpool run exited {run.proc.returncode}: {err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.01)


def waiting_pids(socket: Path) -> list[int]:
    return [w["pid"] for w in status_of(socket)["waiting"]]


def gone(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (dead, unreaped by a parent that is not ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"
