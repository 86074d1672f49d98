"""Real processes for the tests of the job commands (tests/jobs, tests/cli): ``hwpool``
commands on a state directory of the test's, and the stand-in launcher
(tests/jobs/standin_launcher.py) that plays a running job. Every wait is bounded; a line is
awaited from a reader thread, never slept for.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from hostserver import BOUND, SRC
from hwpool._jobs._supervisor import LOCK_NAME, LOG_NAME
from interactive import interactive

STANDIN = Path(__file__).resolve().parent / "jobs" / "standin_launcher.py"


NO_SERVER = {"HWPOOL_AUTOSTART": "0", "HWPOOL_SOCKET": "/nonexistent/hwpool.sock",
             "HWPOOL_SYSTEM_SOCKET": ""}  # fmt: skip
"""Where a supervisor that ``retry`` starts finds no server, and starts none (the test kills
it: :func:`kill_supervisor`)."""


def job_env(state_dir: Path, **extra: str) -> dict[str, str]:
    """This environment with this tree's sources and ``state_dir`` as the state directory
    (and no server: see :data:`NO_SERVER`)."""
    return {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1", **NO_SERVER,
            "HWPOOL_STATE_DIR": str(state_dir), **extra}  # fmt: skip


def supervisor_pid(state_dir: Path) -> int | None:
    """The pid in ``state_dir``'s supervisor lock (None if no supervisor ever ran there)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((state_dir / LOCK_NAME).read_text().split()[0])
    return None


def kill_supervisor(state_dir: Path) -> None:
    """SIGKILL the supervisors of ``state_dir`` that ``retry`` or ``submit`` started: the one
    in the lock, and any other waiting for the lock to take over (two started at once)."""
    deadline = time.monotonic() + BOUND
    while supervisor_pid(state_dir) is None and (state_dir / LOG_NAME).exists():
        if time.monotonic() > deadline:  # its log is made first, its lock once it forked
            raise AssertionError(f"a supervisor was started in {state_dir} but never ran")
        time.sleep(0.02)
    for pid in _supervisors_of(state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _supervisors_of(state_dir: Path) -> list[int]:
    """The pids of the supervisor processes started for ``state_dir`` (by their command)."""
    found = []
    wanted = [b"hwpool._cli._supervise", os.fsencode(state_dir)]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            words = (proc / "cmdline").read_bytes().split(b"\0")
            if any(wanted[0] in word for word in words) and wanted[1] in words:
                found.append(int(proc.name))
    return found


def hwpool(
    state_dir: Path, *args: str, timeout: float = BOUND * 6
) -> subprocess.CompletedProcess[str]:
    """``python -m hwpool ARGS`` with ``state_dir``; its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args], capture_output=True, text=True,
        env=job_env(state_dir), timeout=timeout, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


class Lines:
    """The lines a pipe yields, read by a thread of their own."""

    def __init__(self, pipe: IO[str]) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self._thread.start()

    def _drain(self, pipe: IO[str]) -> None:
        for line in pipe:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def next(self, timeout: float = BOUND) -> str | None:
        """The next line (None at the end of the stream); AssertionError after ``timeout``."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None

    def rest(self) -> list[str]:
        """Every line up to the end of the stream."""
        found = []
        while (line := self.next()) is not None:
            found.append(line)
        return found


class Command:
    """One ``hwpool ...`` process running in the background, its stdout and stderr read line
    by line."""

    def __init__(self, state_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(  # interactive: interrupt() must reach it under nohup
            interactive([sys.executable, "-m", "hwpool", *args]), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(state_dir),
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.lines = Lines(self.proc.stdout)
        self.errors = Lines(self.proc.stderr)

    def finish(self) -> tuple[int, str]:
        """Its exit status and what is left of its stderr, once it ended (bounded)."""
        try:
            self.proc.wait(timeout=BOUND * 3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"hwpool did not exit: {self.errors.rest()}") from None
        return self.proc.returncode, "".join(line + "\n" for line in self.errors.rest())

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)


class Standin:
    """The stand-in launcher running one job (see tests/jobs/standin_launcher.py)."""

    def __init__(
        self, state_dir: Path, job_id: str | None = None, *, add: str = "standin",
        argv: Sequence[str] | None = None, env: dict[str, str] | None = None,
        script: Path = STANDIN,
    ) -> None:  # fmt: skip
        """``argv``: the command that starts Python (another user's, say); ``env``: its
        environment (default: this tree's, with ``state_dir``); ``script``: the stand-in's
        file (a copy another user may read)."""
        target = [job_id] if job_id is not None else ["--add", add]
        python = list(argv) if argv is not None else [sys.executable]
        self.proc = subprocess.Popen(
            [*python, str(script), str(state_dir), *target], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env if env is not None else job_env(state_dir),
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.lines = Lines(self.proc.stdout)
        first = self.lines.next()
        if first is None or not first.startswith("running "):
            raise AssertionError(f"the stand-in launcher did not start: {self.stderr()}")
        self.job_id = first.split()[1]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        self.proc.wait(timeout=BOUND)
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def end(self, command: str) -> int:
        """Send a last command (``exit 3``, ``die``, ...); the launcher's exit status."""
        self.send(command)
        return self.proc.wait(timeout=BOUND)

    def wait(self) -> int:
        return self.proc.wait(timeout=BOUND * 3)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=BOUND)
