"""Helpers of the job table's tests (imported by them; tests/jobs is on their path)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from hwpool._jobs._model import JobRecord
from hwpool._jobs._store import JobStore


def add(
    store: JobStore, argv: tuple[str, ...] = ("python", "train.py"), **fields: Any
) -> JobRecord:
    """A job added with a plain working directory and environment unless ``fields`` say."""
    fields.setdefault("cwd", "/srv/work")
    fields.setdefault("environment", {"PATH": "/usr/bin", "TOKEN": "secret"})
    return store.add(argv, **fields)


def dump(path: Path) -> str:
    """The whole table as SQL text, read through a connection of its own: equal dumps mean
    nothing changed."""
    connection = sqlite3.connect(path)
    try:
        return "\n".join(connection.iterdump())
    finally:
        connection.close()
