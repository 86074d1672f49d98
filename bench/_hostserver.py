"""Helpers shared by the host-server benchmarks: a real ``hwpool serve``, a bare echo server.

Both run as child processes on Unix sockets in a short temporary directory, and are stopped
(SIGKILL, then reaped) by the context managers that start them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

STARTUP_S = 20.0


def wait_until_listening(path: Path, proc: subprocess.Popen[bytes]) -> None:
    """Connect until the child answers (bounded): it is ready once connect succeeds."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(path))
            return
        except OSError:
            time.sleep(0.02)
        finally:
            probe.close()
    raise RuntimeError(f"nothing listens on {path} after {STARTUP_S} s")


@contextlib.contextmanager
def _child(
    args: list[str], path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    try:
        wait_until_listening(path, proc)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="hwb", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def host_server(
    gpus: int | None, *extra: str, src: Path | None = None
) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A real ``hwpool serve --gpus N`` (None: without ``--gpus``, for ``--gpu-memory``; its
    log discarded); yields its socket and process. ``src``: the ``src`` folder of another
    checkout of hwpool to run the server from (a baseline), instead of this one's."""
    with short_dir() as directory:
        path = directory / "hwpool.sock"
        sizing = [] if gpus is None else ["--gpus", str(gpus)]
        args = [sys.executable, "-m", "hwpool", "serve", "--socket", str(path), *sizing,
                *extra]  # fmt: skip
        env = None
        if src is not None:
            env = {**os.environ, "PYTHONPATH": str(src)}  # ahead of this checkout
        with _child(args, path, env) as proc:
            yield path, proc


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


async def _echo_forever(path: str) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_unix_server(_Echo, path)
    await asyncio.Event().wait()


@contextlib.contextmanager
def echo_server() -> Iterator[Path]:
    """An asyncio echo server (an ``asyncio.Protocol``, as hwpool serve) on a Unix socket."""
    with short_dir() as directory:
        path = directory / "echo.sock"
        here = os.path.dirname(os.path.abspath(__file__))
        code = f"import sys; sys.path.insert(0, {here!r}); import _hostserver, asyncio; " \
               f"asyncio.run(_hostserver._echo_forever({str(path)!r}))"  # fmt: skip
        with _child([sys.executable, "-c", code], path):
            yield path


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
