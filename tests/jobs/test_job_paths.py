"""Where the job table lives, and the paths it refuses (they hold the jobs' secrets)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from jobtables import add

from hostserver import BOUND
from hwpool._jobs._state import STATE_DIR_VAR, state_directory
from hwpool._jobs._store import JobStore
from hwpool._wire._safety import UnsafePathError
from users import Users, readable_src


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({STATE_DIR_VAR: "/srv/state", "XDG_STATE_HOME": "/x"}, "/srv/state"),
        ({"XDG_STATE_HOME": "/home/a/.st", "HOME": "/home/a"}, "/home/a/.st/hwpool"),
        ({"XDG_STATE_HOME": "relative", "HOME": "/home/a"}, "/home/a/.local/state/hwpool"),
        ({"XDG_STATE_HOME": "", "HOME": "/home/a"}, "/home/a/.local/state/hwpool"),
    ],
)
def test_the_state_directory_follows_the_override_then_xdg_then_home(
    environ: dict[str, str], expected: str
) -> None:
    assert state_directory(environ) == Path(expected)


def test_a_relative_override_is_refused() -> None:
    with pytest.raises(ValueError, match="HWPOOL_STATE_DIR must be an absolute path, got 'st'"):
        state_directory({STATE_DIR_VAR: "st"})


def test_the_directory_and_table_are_made_for_the_user_alone(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "state"
    with JobStore.open(environ={STATE_DIR_VAR: str(directory)}) as store:
        add(store)
        assert store.path == directory / "jobs.db"
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()}
        assert modes == {"jobs.db": 0o600, "jobs.db-wal": 0o600, "jobs.db-shm": 0o600}
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "jobs.db").stat().st_mode) == 0o600


def refused(directory: Path, *fragments: str) -> None:
    """Opening a table in ``directory`` is refused with a message holding ``fragments``."""
    with pytest.raises(UnsafePathError) as raised:
        JobStore.open(directory)
    for fragment in fragments:
        assert fragment in str(raised.value)


def test_a_symbolic_link_for_the_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    refused(tmp_path / "link", "job state directory is unsafe", "link'", "is a symbolic link")
    assert list(real.iterdir()) == []


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        (0o770, "is writable by its group"),
        (0o707, "is writable by everyone"),
        (0o750, "may be read by others (mode 0750)"),
        (0o705, "may be read by others (mode 0705)"),
    ],
)
def test_a_directory_others_may_write_or_read_is_refused(
    tmp_path: Path, mode: int, fragment: str
) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    directory.chmod(mode)
    refused(directory, str(directory), fragment)
    assert list(directory.iterdir()) == []


def test_a_symbolic_link_for_the_table_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    target = tmp_path / "elsewhere.db"
    (directory / "jobs.db").symlink_to(target)
    refused(directory, "the job table", "jobs.db", "is a symbolic link")
    assert not target.exists()


@pytest.mark.parametrize(
    ("mode", "fragment"), [(0o620, "is writable by others"), (0o640, "may be read by others")]
)
def test_a_table_others_may_write_or_read_is_refused(
    tmp_path: Path, mode: int, fragment: str
) -> None:
    directory = tmp_path / "state"
    JobStore.open(directory).close()
    (directory / "jobs.db").chmod(mode)
    refused(directory, "the job table", "jobs.db", fragment)


def test_a_table_with_another_name_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    JobStore.open(directory).close()
    os.link(directory / "jobs.db", tmp_path / "second-name")
    refused(directory, "has 2 hard links")


# ----------------------------------------------------------------- another user
def test_another_users_directory_is_refused(tmp_path: Path, users: Users) -> None:
    other = users.user()
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    os.chown(directory, other.uid, other.gid)
    refused(directory, str(directory), f"belongs to uid {other.uid} ({other.name})")


def test_another_users_table_in_my_directory_is_refused(tmp_path: Path, users: Users) -> None:
    other = users.user()
    directory = tmp_path / "state"
    JobStore.open(directory).close()
    os.chown(directory / "jobs.db", other.uid, other.gid)
    refused(directory, "the job table", f"belongs to uid {other.uid} ({other.name})")


OPEN_AND_ADD = """
import sys
from pathlib import Path
from hwpool._jobs._store import JobStore
from hwpool._wire._safety import UnsafePathError
try:
    with JobStore.open(Path(sys.argv[1])) as store:
        print(store.add(["true"], cwd="/", environment={}).id)
except (UnsafePathError, PermissionError) as exc:
    print(type(exc).__name__, exc)
"""


def test_a_second_user_neither_reads_my_table_nor_is_read(tmp_path: Path, users: Users) -> None:
    other = users.user()
    mine = tmp_path / "mine"
    with JobStore.open(mine) as store:
        add(store, environment={"TOKEN": "mine-only"})
    theirs = Path("/tmp") / f"hwpool-jobs-{other.name}"  # /tmp/pytest-of-root is root's only
    env = users.env(PYTHONPATH=readable_src())
    try:
        for directory, expected in ((mine, "PermissionError"), (theirs, "j1")):
            done = subprocess.run(
                users.command(other, ["-c", OPEN_AND_ADD, str(directory)]),
                capture_output=True, text=True, env=env, timeout=BOUND * 3, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith(expected), done.stdout
        refused(theirs, f"belongs to uid {other.uid} ({other.name})")
        assert stat.S_IMODE((theirs / "jobs.db").stat().st_mode) == 0o600
    finally:
        subprocess.run(["rm", "-rf", str(theirs)], timeout=BOUND, check=False)
