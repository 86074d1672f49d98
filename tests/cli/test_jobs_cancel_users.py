"""Cancelling another user's jobs: root and an admin of the server (the uid it runs as) may
(``hwpool cancel --user NAME jN``), a member may not (neither that way nor by the server id
of the job's request), and a refusal changes nothing. Real Unix users (tests/users.py; the
tests run as root, skipped elsewhere): carol runs the server (its admin), alice and bob are
members of its ``--group``; alice's real ``hwpool submit``, supervisor, launcher and jobs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import users as unix_users
from hostserver import BOUND, SRC, Server, status_of
from users import User, Users

users = unix_users.users  # the fixture: real Unix users, made for one test
LONG = 45.0  # below pytest-timeout's 60 s: a wait that runs out says what it saw


@dataclass
class Person:
    """A real user with a home of their own (for the default state directory)."""

    user: User
    home: Path

    @property
    def state(self) -> Path:
        return self.home / ".local" / "state" / "hwpool"


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder of root's that every user may pass through: homes and the server's socket."""
    folder = Path(tempfile.mkdtemp(prefix="hwc", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], timeout=BOUND, check=False)


@pytest.fixture
def group(users: Users) -> int:
    """The server's ``--group``: alice and bob are members."""
    return users.group()


@pytest.fixture
def carol(users: Users, place: Path, group: int) -> Person:
    """The user the server runs as (an admin of it), in its group to give it the socket."""
    user = users.user([group])
    home = place / user.name
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)
    return Person(user, home)


@pytest.fixture
def server(users: Users, carol: Person, group: int) -> Iterator[Server]:
    """A server run by carol, in a folder of hers, for the members of ``group``."""
    env = users.env(HOME=str(carol.home))
    python = users.command(carol.user, [])
    started = Server(carol.home / "s.sock", "--gpus", "1", "--group", str(group), env=env,
                     python=python).ready()  # fmt: skip
    yield started
    started.kill()


@pytest.fixture
def people(users: Users, place: Path, group: int) -> Iterator[list[Person]]:
    """alice and bob (unique names), members of the server's group, each with a home."""
    made: list[Person] = []
    for _ in range(2):
        user = users.user([group])
        home = place / user.name
        home.mkdir(mode=0o700)
        os.chown(home, user.uid, user.gid)
        subprocess.run(["usermod", "-d", str(home), user.name], check=True,
                       capture_output=True, timeout=BOUND)  # fmt: skip
        made.append(Person(user, home))
    yield made
    for person in made:  # alice's supervisor, launchers and jobs
        subprocess.run(["pkill", "-KILL", "-u", str(person.user.uid)], timeout=BOUND,
                       check=False)  # fmt: skip


REEXEC = "import subprocess, sys; subprocess.run([sys.executable, '-c', ''], check=True)"


def python_for(users: Users, person: Person) -> str:
    """An interpreter ``person`` may run, and that may start itself again as ``person`` (the
    supervisor and the launcher do): this one, or the system's."""
    for candidate in (sys.executable, "/usr/bin/python3", shutil.which("python3") or ""):
        probe = users.argv(person.user, [candidate, "-c", REEXEC])
        if candidate and subprocess.run(probe, capture_output=True, timeout=BOUND,
                                        check=False).returncode == 0:  # fmt: skip
            return candidate
    pytest.skip("no Python that another user may run and start again")


def as_user(
    users: Users, person: Person, server: Server, *args: str
) -> subprocess.CompletedProcess[str]:
    """``python -m hwpool ARGS`` as ``person``, on ``server``, with their home."""
    env = users.env(HOME=str(person.home), HWPOOL_SOCKET=str(server.socket),
                    HWPOOL_AUTOSTART="0", HWPOOL_SYSTEM_SOCKET="")  # fmt: skip
    return subprocess.run(
        users.argv(person.user, [python_for(users, person), "-m", "hwpool", *args]),
        capture_output=True, text=True, env=env, timeout=LONG, check=False, cwd="/",
    )  # fmt: skip


def as_root(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "HWPOOL_SOCKET": str(server.socket)}
    return subprocess.run([sys.executable, "-m", "hwpool", *args], capture_output=True,
                          text=True, env=env, timeout=LONG, check=False)  # fmt: skip


def jobs_of(server: Server, person: Person) -> dict[str, dict[str, Any]]:
    """``person``'s jobs, as root reads them (read-only)."""
    done = as_root(server, "jobs", "--all", "--json", "--user", person.user.name)
    assert done.returncode == 0, done.stderr
    return {job["id"]: job for job in json.loads(done.stdout)}


def settled(jobs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The jobs' records less the fields that change with the clock (waited, ran, GPU-seconds)."""
    return {key: {k: v for k, v in job.items() if k not in ("waited_s", "ran_s", "gpu_seconds")}
            for key, job in jobs.items()}  # fmt: skip


def until(server: Server, person: Person, job_id: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + LONG
    while (job := jobs_of(server, person)[job_id])["state"] != state:
        assert time.monotonic() < deadline, f"{job_id} never {state}: {job}"
        time.sleep(0.1)
    return job


def request_of(server: Server, job_id: str) -> int:
    """The server's id of the request or lease labelled ``job_id`` (bounded wait)."""
    deadline = time.monotonic() + LONG
    while True:
        status = status_of(server.socket)
        for record in [*status["leases"], *status["waiting"]]:
            if (record.get("name") or "").split(" ")[0] == job_id:
                return int(record["id"])
        assert time.monotonic() < deadline, f"no request of {job_id}: {status}"
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_root_and_an_admin_may_cancel_another_users_jobs_and_a_member_may_not(
    users: Users, people: list[Person], carol: Person, server: Server
) -> None:
    alice, bob = people
    sleeper = shutil.which("sleep") or "/bin/sleep"
    submitted = [as_user(users, alice, server, "submit", "--", sleeper, "60") for _ in range(3)]
    assert all(done.returncode == 0 for done in submitted), [d.stderr for d in submitted]
    running, queued, last = (done.stdout.strip() for done in submitted)
    until(server, alice, running, "running")
    waiting = request_of(server, queued)
    before = settled(jobs_of(server, alice))

    lease = request_of(server, running)
    for args in (("cancel", "--user", alice.user.name, running, queued),
                 ("cancel", str(waiting)), ("cancel", str(lease))):  # fmt: skip
        refused = as_user(users, bob, server, *args)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        assert "Traceback" not in refused.stderr
    assert settled(jobs_of(server, alice)) == before  # a refusal changes nothing
    assert request_of(server, queued) == waiting

    # carol, the server's admin, through the server: the queued job's request, the running
    # job's lease (both labelled with the job's id there)
    done = as_user(users, carol, server, "cancel", "--user", alice.user.name, queued, running)
    assert done.returncode == 0, (done.stdout, done.stderr)
    withdrawn = until(server, alice, queued, "cancelled")
    assert f"cancelled by {carol.user.name}" in withdrawn["reason"], withdrawn
    ended = until(server, alice, running, "cancelled")
    assert "its lease was revoked" in ended["reason"], ended

    # root, as alice in her own table: the last job, queued or running by now
    done = as_root(server, "cancel", "--user", alice.user.name, last)
    assert done.returncode == 0, (done.stdout, done.stderr)
    cancelled = until(server, alice, last, "cancelled")
    assert cancelled["reason"] == "cancelled by root" or cancelled["signal_name"] == "SIGTERM"
    for folder, _, files in os.walk(alice.state):  # nothing of root's left in alice's place
        for name in [".", *files]:
            assert os.lstat(Path(folder) / name).st_uid == alice.user.uid, (folder, name)
    deadline = time.monotonic() + LONG
    while status_of(server.socket)["leases"] or status_of(server.socket)["waiting"]:
        assert time.monotonic() < deadline, status_of(server.socket)
        time.sleep(0.1)


def test_cancel_user_needs_job_ids_and_a_known_user(people: list[Person], server: Server) -> None:
    alice, _ = people
    for args, words in [
        (("cancel", "--user", "no-such-user-hwpool", "j1"), "no user named"),
        (("cancel", "--user", alice.user.name, "3"), "job ids only"),
        (("cancel", "--user", alice.user.name, "j1"), "no job 'j1'"),
    ]:
        done = as_root(server, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert words in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not alice.state.exists()  # nothing was made in alice's home


@pytest.mark.timeout(240)
def test_cancel_user_without_ids_cancels_all_their_jobs_or_those_in_a_state(
    users: Users, people: list[Person], carol: Person, server: Server
) -> None:
    """``scancel -u NAME``'s counterpart: root with ``--state queued`` first (only the queued
    and held ones go), then the server's admin with nothing more (the running one too)."""
    alice, bob = people
    sleeper = shutil.which("sleep") or "/bin/sleep"
    submitted = [
        as_user(users, alice, server, "submit", *hold, "--", sleeper, "60")
        for hold in ((), (), ("--hold",))
    ]  # fmt: skip
    assert all(done.returncode == 0 for done in submitted), [d.stderr for d in submitted]
    running, queued, held = (done.stdout.strip() for done in submitted)
    until(server, alice, running, "running")
    request_of(server, queued)

    refused = as_user(users, bob, server, "cancel", "--user", alice.user.name)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert until(server, alice, queued, "queued")["state"] == "queued"

    done = as_root(server, "cancel", "--user", alice.user.name, "--state", "queued,held")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert until(server, alice, queued, "cancelled")["ended_by"] == "root"
    assert until(server, alice, held, "cancelled")["reason"] == "cancelled by root"
    assert jobs_of(server, alice)[running]["state"] == "running"

    done = as_user(users, carol, server, "cancel", "--user", alice.user.name)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "its lease was revoked" in until(server, alice, running, "cancelled")["reason"]
    done = as_root(server, "cancel", "--user", alice.user.name)
    assert (done.returncode, done.stdout.split(" has ")[1:]) == (0, ["no job to cancel (held, "
        "queued, running, waiting-on-dependency)\n"]), done.stderr  # fmt: skip


def test_cancel_state_needs_user_and_unfinished_states(server: Server) -> None:
    for args, words in [
        (("cancel", "--state", "queued"), "--state selects the jobs of --user NAME"),
        (("cancel", "--user", "root", "--state", "succeeded"), "only jobs that have not finished"),
        (("cancel", "--user", "root", "--state", "queued", "j1"), "give one or the other"),
    ]:
        done = as_root(server, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert words in done.stderr, (args, done.stderr)


@pytest.mark.timeout(240)
def test_root_may_hold_release_and_update_another_users_job_and_a_member_may_not(
    users: Users, people: list[Person], server: Server
) -> None:
    alice, bob = people
    sleeper = shutil.which("sleep") or "/bin/sleep"
    submitted = [as_user(users, alice, server, "submit", "--", sleeper, "60") for _ in range(2)]
    assert all(done.returncode == 0 for done in submitted), [d.stderr for d in submitted]
    running, queued = (done.stdout.strip() for done in submitted)
    until(server, alice, running, "running")
    request_of(server, queued)
    before = settled(jobs_of(server, alice))
    for args in (("hold", queued), ("release", queued), ("update", queued, "--priority", "3")):
        refused = as_user(users, bob, server, *args, "--user", alice.user.name)
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        assert "only root may" in refused.stderr and "Traceback" not in refused.stderr
    assert settled(jobs_of(server, alice)) == before  # a refusal changes nothing

    done = as_root(server, "hold", "--user", alice.user.name, queued)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert until(server, alice, queued, "held")["held_by"] == "root"
    done = as_root(server, "update", "--user", alice.user.name, queued, "--priority", "3")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert jobs_of(server, alice)[queued]["priority"] == 3
    done = as_root(server, "hold", "--user", alice.user.name, running)
    assert done.returncode == 2 and f"{running} is running" in done.stderr
    done = as_root(server, "logs", "--user", alice.user.name, running)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr  # sleep writes nothing
    refused = as_user(users, bob, server, "logs", "--user", alice.user.name, running)
    assert refused.returncode == 1 and "only root may" in refused.stderr
    done = as_root(server, "release", "--user", alice.user.name, queued)
    assert (done.returncode, done.stdout) == (0, f"{queued}: released\n"), done.stderr
    assert until(server, alice, queued, "queued")["held_by"] is None
    for folder, _, files in os.walk(alice.state):  # nothing of root's left in alice's place
        for name in [".", *files]:
            assert os.lstat(Path(folder) / name).st_uid == alice.user.uid, (folder, name)
    done = as_root(server, "cancel", "--user", alice.user.name)
    assert done.returncode == 0, (done.stdout, done.stderr)
