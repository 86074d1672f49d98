"""The table shared by processes: one that keeps it open (the supervisor) while others open
and close it again and again (``hwpool jobs``, launchers) still has its commits seen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobtables import add

from hostserver import ENV
from hwpool._jobs._model import JobState
from hwpool._jobs._store import JobStore

OPEN_AND_CLOSE = """
import sys
from hwpool._jobs._store import JobStore
for _ in range(int(sys.argv[2])):
    with JobStore.open(sys.argv[1]) as store:
        store.list()
"""
STATE_OF = """
import sys
from hwpool._jobs._store import JobStore
with JobStore.open(sys.argv[1]) as store:
    print(store.get(sys.argv[2]).state.value)
"""


def _python(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=ENV, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_long_open_table_keeps_its_commits_seen_while_others_open_and_close_it(
    tmp_path: Path,
) -> None:
    """Closing the descriptor the safety checks opened dropped this process's sqlite locks
    (POSIX locks are per process, dropped by any close of the file): the next process to
    close the table took itself for the last and removed the write-ahead log under this
    one, so that its later commits went to an unlinked file nobody else read."""
    directory = tmp_path / "state"
    with JobStore.open(directory) as store:
        job = add(store)
        _python(OPEN_AND_CLOSE, str(directory), "3")
        store.mark_cancelled(job.id)
        _python(OPEN_AND_CLOSE, str(directory), "1")
        assert _python(STATE_OF, str(directory), job.id) == JobState.CANCELLED.value


def test_open_takes_a_string_path_as_well(tmp_path: Path) -> None:
    with JobStore.open(str(tmp_path / "state")) as store:
        assert store.path == tmp_path / "state" / "jobs.db"
