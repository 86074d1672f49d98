"""Jobs of real Unix users (the tests run as root; skipped elsewhere): each user sees only
their own jobs and logs, and root's ``hwpool jobs --user NAME`` / ``--all-users`` reads
theirs without creating or changing anything in their directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import users as unix_users
from hostserver import BOUND, SRC
from jobprocs import STANDIN, Lines, Standin
from users import User, Users, readable

users = unix_users.users  # the fixture: real Unix users, made for one test


@dataclass
class Person:
    """A real user with a home of their own (for the default state directory)."""

    user: User
    home: Path

    @property
    def state(self) -> Path:
        return self.home / ".local" / "state" / "hwpool"


@pytest.fixture
def people(users: Users) -> Iterator[list[Person]]:
    """Two real users, alice and bob (unique names), each with a home in a folder of root's
    under /tmp (a home right in /tmp could have been made by anyone: refused)."""
    made: list[Person] = []
    homes = Path(tempfile.mkdtemp(prefix="hwpool-homes-", dir="/tmp"))
    homes.chmod(0o755)
    try:
        for _ in range(2):
            user = users.user()
            home = homes / user.name
            home.mkdir(mode=0o700)
            os.chown(home, user.uid, user.gid)
            subprocess.run(["usermod", "-d", str(home), user.name], check=True,
                           capture_output=True, timeout=BOUND)  # fmt: skip
            made.append(Person(user, home))
        yield made
    finally:
        subprocess.run(["rm", "-rf", str(homes)], timeout=BOUND, check=False)


def as_user(users: Users, person: Person, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m hwpool ARGS`` as ``person``, with their home (their default state dir)."""
    return subprocess.run(
        users.command(person.user, ["-m", "hwpool", *args]), capture_output=True, text=True,
        env=users.env(HOME=str(person.home)), timeout=BOUND * 3, check=False,
    )  # fmt: skip


def give_job(users: Users, person: Person, name: str, output: str) -> None:
    """A job of ``person``'s, named ``name``, that wrote ``output`` and succeeded (run by the
    stand-in launcher as that user)."""
    launcher = Standin(
        person.state, add=name, argv=users.argv(person.user, [users.python(person.user)]),
        env=users.env(HOME=str(person.home)), script=readable(STANDIN),
    )  # fmt: skip
    launcher.send(f"out {output}")
    assert launcher.end("exit 0") == 0


def as_root(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("HWPOOL_STATE_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "hwpool", *args], capture_output=True, text=True, env=env,
        timeout=BOUND * 3, check=False,
    )  # fmt: skip


def snapshot(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every entry under ``folder``: inode, owner, mode, and for files size and time."""
    found = {}
    for path in sorted(folder.rglob("*")):
        info = os.lstat(path)
        timed = () if path.name.endswith("-shm") else (info.st_size, info.st_mtime_ns)
        found[str(path)] = (info.st_ino, info.st_uid, info.st_mode, *timed)
    return found


def jobs_of(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert proc.returncode == 0, proc.stderr
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    return found


# ----------------------------------------------------------------- two users
def test_users_see_only_their_own_jobs_and_logs(users: Users, people: list[Person]) -> None:
    alice, bob = people
    give_job(users, alice, "alice-job", "alice's output")
    give_job(users, bob, "bob-job", "bob's output")
    for person, name, output in ((alice, "alice-job", "alice's output"),
                                 (bob, "bob-job", "bob's output")):  # fmt: skip
        jobs = jobs_of(as_user(users, person, "jobs", "--all", "--json"))
        assert [(job["id"], job["name"], job["user"]) for job in jobs] == [
            ("j1", name, person.user.name)
        ]
        assert as_user(users, person, "logs", "j1").stdout == output + "\n"


def test_a_user_cannot_read_anothers_table_or_logs(users: Users, people: list[Person]) -> None:
    alice, bob = people
    give_job(users, alice, "alice-job", "alice's output")
    env = users.env(HOME=str(bob.home), HWPOOL_STATE_DIR=str(alice.state))
    for args in (["jobs", "--all"], ["logs", "j1"], ["wait", "j1"], ["cancel", "j1"]):
        proc = subprocess.run(
            users.command(bob.user, ["-m", "hwpool", *args]), capture_output=True, text=True,
            env=env, timeout=BOUND * 3, check=False,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert "alice-job" not in proc.stdout + proc.stderr
        assert "alice's output" not in proc.stdout + proc.stderr
    for path in (alice.state / "jobs.db", alice.state / "logs" / "j1.out"):
        cat = subprocess.run(users.argv(bob.user, ["cat", str(path)]), capture_output=True,
                             text=True, timeout=BOUND, check=False)  # fmt: skip
        assert cat.returncode != 0 and "Permission denied" in cat.stderr


def test_only_root_reads_other_users_jobs(users: Users, people: list[Person]) -> None:
    alice, bob = people
    give_job(users, alice, "alice-job", "alice's output")
    for args in (["--all-users"], ["--user", alice.user.name]):
        proc = as_user(users, bob, "jobs", *args)
        assert proc.returncode == 2 and proc.stdout == ""
        assert f"{args[0]} reads other users' job tables: only root may" in proc.stderr
        assert "alice-job" not in proc.stderr


# ----------------------------------------------------------------- root's view
def test_root_reads_every_users_jobs_and_changes_nothing(
    users: Users, people: list[Person]
) -> None:
    alice, bob = people
    give_job(users, alice, "alice-job", "alice's output")
    give_job(users, bob, "bob-job", "bob's output")
    before = snapshot(alice.home) | snapshot(bob.home)
    assert not (alice.state / "jobs.db-wal").exists()  # nothing has it open: read immutable
    mine = {alice.user.name, bob.user.name}
    jobs = jobs_of(as_root("jobs", "--all-users", "--all", "--json"))
    seen = sorted((job["user"], job["id"], job["name"]) for job in jobs if job["user"] in mine)
    assert seen == sorted([(alice.user.name, "j1", "alice-job"), (bob.user.name, "j1", "bob-job")])
    only = jobs_of(as_root("jobs", "--user", alice.user.name, "--all", "--json"))
    assert [(job["user"], job["name"]) for job in only] == [(alice.user.name, "alice-job")]
    text = as_root("jobs", "--user", alice.user.name, "--all")
    assert text.stdout.split()[:2] == ["USER", "ID"] and "alice-job" in text.stdout
    assert snapshot(alice.home) | snapshot(bob.home) == before


HOLD = """
import sys
from pathlib import Path
from hwpool._jobs._store import JobStore
with JobStore.open(Path(sys.argv[1])) as store:
    store.list()
    print("open", flush=True)
    sys.stdin.readline()
"""


def test_root_reads_a_table_in_use_through_its_log(users: Users, people: list[Person]) -> None:
    alice, _ = people
    give_job(users, alice, "alice-job", "alice's output")
    holder = subprocess.Popen(
        users.command(alice.user, ["-c", HOLD, str(alice.state)]), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=users.env(HOME=str(alice.home)),
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert Lines(holder.stdout).next() == "open"
        assert (alice.state / "jobs.db-wal").exists()
        before = snapshot(alice.home)
        only = jobs_of(as_root("jobs", "--user", alice.user.name, "--all", "--json"))
        assert [job["name"] for job in only] == ["alice-job"]
        assert snapshot(alice.home) == before
    finally:
        holder.kill()
        holder.wait(timeout=BOUND)


def test_root_skips_an_unsafe_table_and_says_so(users: Users, people: list[Person]) -> None:
    alice, bob = people
    give_job(users, alice, "alice-job", "alice's output")
    give_job(users, bob, "bob-job", "bob's output")
    alice.state.chmod(0o755)
    proc = as_root("jobs", "--all-users", "--all", "--json")
    assert proc.returncode == 1
    names = [job["name"] for job in json.loads(proc.stdout)]
    assert "bob-job" in names and "alice-job" not in names
    assert f"{alice.user.name}'s jobs were not read" in proc.stderr
    assert "may be read by others (mode 0755)" in proc.stderr


def test_root_refuses_a_table_that_is_a_symbolic_link(users: Users, people: list[Person]) -> None:
    alice, bob = people
    give_job(users, bob, "bob-job", "bob's output")
    alice.state.mkdir(parents=True, mode=0o700)
    for folder in (alice.home / ".local", alice.home / ".local" / "state", alice.state):
        os.chown(folder, alice.user.uid, alice.user.gid)
    os.symlink(bob.state / "jobs.db", alice.state / "jobs.db")
    proc = as_root("jobs", "--user", alice.user.name, "--all", "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout) == []
    assert "is a symbolic link" in proc.stderr


SPOIL = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("UPDATE jobs SET argv = 'not json', gpus = 'x/y'")
connection.close()
"""


def test_root_skips_a_table_with_an_unreadable_row_and_says_why(
    users: Users, people: list[Person]
) -> None:
    alice, bob = people
    give_job(users, alice, "alice-job", "alice's output")
    give_job(users, bob, "bob-job", "bob's output")
    spoil = users.command(alice.user, ["-c", SPOIL, str(alice.state / "jobs.db")])
    subprocess.run(spoil, env=users.env(HOME=str(alice.home)), check=True, timeout=BOUND)
    proc = as_root("jobs", "--all-users", "--all", "--json")
    assert proc.returncode == 1, proc.stderr
    names = [job["name"] for job in json.loads(proc.stdout)]
    assert "bob-job" in names and "alice-job" not in names
    assert f"{alice.user.name}'s jobs were not read" in proc.stderr
    assert "has a row that cannot be read" in proc.stderr and "Traceback" not in proc.stderr
