"""Fixtures of the ``hwpool run`` tests: real servers on temporary sockets, real runs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostserver import Server
from users import users  # noqa: F401  (real Unix users, for the multi-user tests)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory in /tmp (a socket path holds at most 107 bytes; tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="hwr", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_server(sockdir: Path) -> Iterator[Callable[..., Server]]:
    """``start_server(*args, env=None)`` starts a server on sockdir/s.sock and waits for it."""
    servers: list[Server] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Server:
        server = Server(sockdir / "s.sock", *args, env=env)
        servers.append(server)
        return server.ready()

    yield start
    for server in servers:
        server.kill()
