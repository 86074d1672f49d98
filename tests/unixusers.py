"""A real second Unix user for multi-user tests: created with useradd, removed after.

Only root can create one; elsewhere the tests that need one are skipped, saying why. Its
processes run through ``setpriv`` (util-linux) with its uid, gid and no other groups.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

BOUND = 10.0


@dataclass(frozen=True)
class UnixUser:
    """A user (and its own primary group) that exists for one test."""

    name: str
    uid: int
    gid: int

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as this user, with no supplementary groups."""
        return [
            "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *argv,
        ]  # fmt: skip


def _why_not() -> str | None:
    """Why no user can be made here, or None."""
    if os.geteuid() != 0:
        return "creating a second Unix user needs root"
    for tool in ("useradd", "userdel", "groupdel", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@contextlib.contextmanager
def unix_user(prefix: str = "hwpt") -> Iterator[UnixUser]:
    """A fresh user ``prefix`` + random hex, with a group of its own name; skips the test
    where none can be made, and removes both afterwards."""
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    name = f"{prefix}{secrets.token_hex(4)}"
    made = subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
        capture_output=True, text=True, timeout=BOUND, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        user = UnixUser(name, entry.pw_uid, entry.pw_gid)
        probe = subprocess.run(
            user.command([sys.executable, "-c", "pass"]),
            capture_output=True, text=True, timeout=BOUND, check=False,
        )  # fmt: skip
        if probe.returncode != 0:
            pytest.skip(f"{sys.executable} cannot run as another user: {probe.stderr.strip()}")
        yield user
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=BOUND, check=False)
        subprocess.run(["groupdel", name], capture_output=True, timeout=BOUND, check=False)
