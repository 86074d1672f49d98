"""Real Unix users and groups for the multi-user tests, and processes run as them.

Only root can make them (``useradd``, ``groupadd``), and only with ``setpriv`` can a process
become them; elsewhere the tests that need them are skipped, saying why. Each user and group
has a unique name and is deleted after the test. A process of another user needs an
interpreter it may execute: this one, when it can, else the system's ``python3``.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

import hermetic
from hostserver import BOUND, SRC


@dataclass(frozen=True)
class User:
    """A real user made for one test (its own primary group)."""

    name: str
    uid: int
    gid: int


def need_root() -> None:
    """Skip the test unless real users can be made and become (root, useradd, setpriv)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create real Unix users (useradd) and to become them")
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool} to create real Unix users and run as them")


class Users:
    """Makes users and groups for one test, and deletes them after it."""

    def __init__(self) -> None:
        self.users: list[str] = []
        self.groups: list[str] = []
        self._python: str | None = None

    def group(self) -> int:
        """A new group; its gid."""
        name = _unique("hwg")
        subprocess.run(["groupadd", name], check=True, capture_output=True, timeout=BOUND)
        self.groups.append(name)
        return int(_getent("group", name)[2])

    def user(self, groups: Sequence[int] = ()) -> User:
        """A new user with a group of its own, also in ``groups`` (gids)."""
        name = _unique("hwu")
        extra = ["-G", ",".join(map(str, groups))] if groups else []
        subprocess.run(
            ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", *extra, name],
            check=True, capture_output=True, timeout=BOUND,
        )  # fmt: skip
        self.users.append(name)
        fields = _getent("passwd", name)
        return User(name, int(fields[2]), int(fields[3]))

    def argv(self, user: User, argv: Sequence[str]) -> list[str]:
        """``argv`` run as ``user``, with the groups it has in /etc/group."""
        return [
            "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--",
            *argv,
        ]  # fmt: skip

    def python(self, user: User) -> str:
        """An interpreter ``user`` may run (this one if it can, else python3 on PATH, else the
        system's): hwpool needs nothing beyond the standard library."""
        if self._python is None:
            check = "import sys; sys.exit(sys.version_info < (3, 11))"
            system = ("/usr/bin/python3", "/usr/local/bin/python3")
            for candidate in (sys.executable, shutil.which("python3") or "", *system):
                probe = self.argv(user, [candidate, "-c", check])
                done = subprocess.run(probe, capture_output=True, timeout=BOUND, check=False)
                if candidate and done.returncode == 0:
                    self._python = candidate
                    break
            else:
                pytest.skip("no Python >= 3.11 that another user may run")
        return self._python

    def command(self, user: User, args: Sequence[str]) -> list[str]:
        """Python with ``args`` (``["-m", "hwpool", ...]``) run as ``user``."""
        return self.argv(user, [self.python(user), *args])

    def env(self, **extra: str) -> dict[str, str]:
        """A plain environment for another user's hwpool process (this tree's sources)."""
        keep = ("PATH", "LANG", "LC_ALL")
        env = {k: v for k, v in os.environ.items() if k in keep}
        path = readable_src()
        return {
            **env, **hermetic.machine(), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
            "HOME": "/", **extra,
        }  # fmt: skip

    def close(self) -> None:
        for name in self.users:
            subprocess.run(["userdel", name], capture_output=True, timeout=BOUND, check=False)
        for name in self.groups:
            subprocess.run(["groupdel", name], capture_output=True, timeout=BOUND, check=False)


@pytest.fixture
def users() -> Iterator[Users]:
    """Real users and groups, deleted after the test (skipped where they cannot be made)."""
    need_root()
    made = Users()
    try:
        yield made
    finally:
        made.close()


_STAGED: list[str] = []


def readable_src() -> str:
    """This tree's sources where every user may read them: SRC itself when each directory
    above it lets others through, else a copy under /tmp (made once)."""
    return readable(Path(SRC) / "hwpool").parent.as_posix()


def readable(path: Path) -> Path:
    """``path`` (a file or a folder) where every user may read it: itself when each directory
    above it lets others through, else a copy in a folder of this run's under /tmp."""
    if _reachable(path):
        return path
    if not _STAGED:
        root = tempfile.mkdtemp(prefix="hwpool-tests-")
        os.chmod(root, 0o755)
        atexit.register(shutil.rmtree, root, True)
        _STAGED.append(root)
    copy = Path(_STAGED[0]) / path.name
    if not copy.exists():
        if path.is_dir():
            shutil.copytree(path, copy, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, copy)
        for folder, dirs, files in os.walk(copy):
            for name in dirs:
                os.chmod(Path(folder) / name, 0o755)
            for name in files:
                os.chmod(Path(folder) / name, 0o644)
        os.chmod(copy, 0o755 if path.is_dir() else 0o644)
    return copy


def _reachable(path: Path) -> bool:
    """Whether others may search every directory from / down to ``path``, and read it."""
    here = Path(path).resolve()
    folders = [*reversed(here.parents), here]
    return all(f.stat().st_mode & 0o005 == 0o005 for f in folders)


def _unique(prefix: str) -> str:
    return f"{prefix}{os.getpid() % 100000}{secrets.token_hex(3)}"


def _getent(database: str, name: str) -> list[str]:
    out = subprocess.run(
        ["getent", database, name], check=True, capture_output=True, text=True, timeout=BOUND
    ).stdout
    return out.strip().split(":")
