"""Fixtures of the server tests: servers on temporary sockets, client processes that drive them.

The processes live in tests/hostserver.py; these fixtures start them and always end them.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakemachine import machine  # noqa: F401  (a fake GPU machine, for the watch tests)

from hostserver import BOUND, ClientProc, Server
from rawpeers import Pair, Peer
from users import Users, users  # noqa: F401  (real Unix users, for the multi-user tests)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory in /tmp (a socket path holds at most 107 bytes; tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="hwp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_server(sockdir: Path) -> Iterator[Callable[..., Server]]:
    """``start_server(*args, socket=None, nofile=None)`` starts a server and waits until it
    serves (``nofile``: its descriptor limit, see ``Server``)."""
    servers: list[Server] = []

    def start(
        *args: str, socket: Path | None = None, wait: bool = True, nofile: int | None = None
    ) -> Server:
        server = Server(socket or sockdir / "s.sock", *args, nofile=nofile)
        servers.append(server)
        return server.ready() if wait else server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def clients() -> Iterator[Callable[..., ClientProc]]:
    """``clients(socket, *args)`` starts a client process; all are killed at the end."""
    procs: list[ClientProc] = []

    def start(socket: Path, *args: str) -> ClientProc:
        proc = ClientProc(socket, *args)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.proc.poll() is None:
            proc.proc.kill()
        proc.proc.communicate(timeout=BOUND)


@pytest.fixture
def pair(users: Users) -> Pair:  # noqa: F811  (the fixture imported above)
    """Two real Unix users in a group of their own, removed after the test (root only:
    skipped otherwise)."""
    gid = users.group()
    alice, bob = users.user([gid]), users.user([gid])
    return Pair(alice.uid, bob.uid, gid)


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A directory on its own small tmpfs (512 KiB: a journal grows to about 110 KiB before it
    is compacted), to be filled up (root only; skipped otherwise)."""
    path = Path(tempfile.mkdtemp(prefix="hwd", dir="/tmp"))
    mount = ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(path)]
    try:
        subprocess.run(mount, check=True, capture_output=True, timeout=BOUND)
    except (OSError, subprocess.CalledProcessError) as exc:
        path.rmdir()
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root and CAP_SYS_ADMIN): {exc}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False, timeout=BOUND)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    """Raw-protocol connections a test opens, closed after it."""
    opened: list[Peer] = []
    yield opened
    for peer in opened:
        peer.close()
