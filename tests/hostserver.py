"""Real ``hwpool serve`` processes for the tests (tests/server, and the GPU suite over a server).

Every wait is bounded and event-driven: readiness is the server's "serving" log line, read by
a thread that drains its stderr.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hwpool import GPUPool
from hwpool._cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
BOUND = 10.0  # seconds: no wait in these tests lasts longer
ENV = {**os.environ, "PYTHONPATH": SRC, "PYTHONUNBUFFERED": "1"}


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run ``hwpool ARGS`` in this process (fast); its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def status_of(socket: Path) -> dict[str, Any]:
    """``hwpool status --json``, in this process."""
    code, out, err = run_cli("status", "--socket", str(socket), "--json")
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


class Server:
    """One ``hwpool serve`` process; its stderr is collected line by line. ``nofile``: the
    descriptors it may open (its RLIMIT_NOFILE, soft and hard), where a test needs it small."""

    def __init__(
        self, socket: Path, *args: str, env: dict[str, str] | None = None,
        nofile: int | None = None, python: Sequence[str] = (sys.executable,),
    ) -> None:  # fmt: skip
        """``python``: the interpreter's argv (another user's: ``users.command(user, [])``)."""
        self.socket = socket
        self.args = args
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [*_limited(nofile, python), "serve", "--socket", str(socket), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=ENV if env is None else env,
        )  # fmt: skip
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, fragment: str, after: int = 0, timeout: float = BOUND) -> str:
        """The first log line from index ``after`` on that contains ``fragment``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[after:]:
                    if fragment in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or not self._drainer.is_alive():
                    raise AssertionError(
                        f"no log line with {fragment!r}:\n" + "\n".join(self.lines)
                    )
                self._changed.wait(min(left, 0.5))

    def ready(self) -> Server:
        self.wait_for("serving")
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` and wait for the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(BOUND)

    def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(BOUND)
        self._drainer.join(BOUND)  # it ends at the end of the pipe
        if self.proc.stderr is not None:
            self.proc.stderr.close()


_LIMITED = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'hwpool', *sys.argv[2:]])"
)


def _limited(nofile: int | None, python: Sequence[str] = (sys.executable,)) -> list[str]:
    """The command that runs ``hwpool`` (its arguments follow), allowed ``nofile``
    descriptors at most where that is given (set before the exec: no preexec_fn in a
    process with threads)."""
    if nofile is None:
        return [*python, "-m", "hwpool"]
    return [*python, "-c", _LIMITED, str(nofile)]


@contextlib.contextmanager
def running_server(*args: str) -> Iterator[Server]:
    """A server on a fresh socket for a whole module (use it in a module-scoped fixture)."""
    directory = Path(tempfile.mkdtemp(prefix="hwp", dir="/tmp"))
    server = Server(directory / "s.sock", *args)
    try:
        yield server.ready()
    finally:
        server.kill()
        shutil.rmtree(directory, ignore_errors=True)


CLIENT = str(Path(__file__).parent / "server" / "client_proc.py")


class ClientProc:
    """A client process (tests/server/client_proc.py) driven one command at a time."""

    def __init__(self, socket: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CLIENT, str(socket), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=ENV,
        )  # fmt: skip
        self.expect("ready")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, prefix: str) -> str:
        """The next line it prints, which must start with ``prefix`` (bounded by BOUND)."""
        assert self.proc.stdout is not None
        line = _readline(self.proc, BOUND)
        assert line.startswith(prefix), f"expected {prefix!r}, got {line!r}"
        return line

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(BOUND)


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()))  # type: ignore[union-attr]
    reader.daemon = True
    reader.start()
    reader.join(timeout)
    if not result or not result[0]:
        proc.kill()
        _, err = proc.communicate(timeout=BOUND)
        raise AssertionError(f"client process said nothing (stderr: {err!r})")
    return result[0].rstrip("\n")


MakePool = Callable[[int], GPUPool]
"""``make_pool(n)``: a GPUPool of ``n`` GPUs on the backend the test is parametrised with."""

MakeSizedPool = Callable[[Sequence[int | str]], GPUPool]
"""``sized_pool(["80GiB", "24GiB"])``: a GPUPool of GPUs of those memory sizes on the backend
the test is parametrised with (in-process, or a fresh ``hwpool serve --gpu-memory``)."""


class ServerFarm:
    """One ``hwpool serve`` per GPU count, started on first use, for a whole test session."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="hwg", dir="/tmp"))
        self.servers: dict[int, Server] = {}

    def socket(self, num_gpus: int) -> Path:
        server = self.servers.get(num_gpus)
        if server is None or server.proc.poll() is not None:
            path = self.directory / f"{num_gpus}.sock"
            server = Server(path, "--gpus", str(num_gpus)).ready()
            self.servers[num_gpus] = server
        return server.socket

    def close(self) -> None:
        for server in self.servers.values():
            server.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; the file that does it."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):  # ENOSPC: as full as pieces of this size go
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return path
