"""Fixtures of the job table's tests: a real sqlite table in a private temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hwpool._jobs._store import JobStore
from users import Users, users  # noqa: F401  (real Unix users, for the multi-user tests)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """Where the table goes (made by the store, mode 0700)."""
    return tmp_path / "state"


@pytest.fixture
def store(state_dir: Path) -> Iterator[JobStore]:
    """A new, empty job table."""
    with JobStore.open(state_dir) as opened:
        yield opened
