"""Fixtures of the ``hwpool submit`` tests: a box (tests/jobbox.py) on a real server, and
the supervisor, launchers and server killed after each test."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostserver import Server
from jobbox import Box
from users import users  # noqa: F401  (real Unix users, for the multi-user tests)


@pytest.fixture
def box_root() -> Iterator[Path]:
    """A short folder in /tmp (a socket path holds at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hws", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_box(box_root: Path) -> Iterator[Callable[..., Box]]:
    """``make_box(*server_args)``: a server with those arguments (default ``--gpus 1``) and a
    box of this user on it."""
    made: list[Box] = []

    def make(*args: str) -> Box:
        server = Server(box_root / "s.sock", *(args or ("--gpus", "1"))).ready()
        box = Box(server, box_root)
        made.append(box)
        return box

    yield make
    for box in made:
        box.kill_all()
        box.server.kill()


@pytest.fixture
def box(make_box: Callable[..., Box]) -> Box:
    return make_box()
