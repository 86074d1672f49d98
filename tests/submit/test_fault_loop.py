"""The fault loop: jobs of two real users run on a root server while the server, the users'
supervisors and their launchers are SIGKILLed at random; then every promise of a shared box
is checked.

- No GPU granted twice: each job takes an exclusive ``flock`` on its GPU's lock file for as
  long as it runs (the kernel drops it when the job's last descriptor goes, that is when the
  job is gone). A job that finds the lock taken ran beside a job still alive on its GPU.
- No job started twice: each job writes one ``start`` line; a job id with two failed.
- Every record true: a job recorded ``succeeded`` wrote its ``end`` line; one that wrote it
  and whose launcher was never killed is recorded ``succeeded``; ``lost`` only where its
  launcher was killed; none left queued or running.
- No lease left held once every process is gone: the server ends with all GPUs free.

CI runs a short loop (``TESTS_HWPOOL_FAULT_LOOP_S``, default 12 s of faults); set it to
several minutes for a long one. The seed is printed (``TESTS_HWPOOL_FAULT_SEED`` replays a
run's choices).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hostserver import BOUND, Server, status_of
from users import User, Users

FAULT_S = float(os.environ.get("TESTS_HWPOOL_FAULT_LOOP_S", "12"))
DRAIN_S = 180.0  # the queue's end once faults stop: restarts, reclaims, hand-over bounds
NUM_GPUS = 2
LAUNCHER_MARK = b"hwpool._cli._launch"

JOB = """\
#!PYTHON
import fcntl, os, sys, time
events, locks, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
job, gpu = os.environ["HWPOOL_JOB_ID"], os.environ["CUDA_VISIBLE_DEVICES"]
lock = os.open(os.path.join(locks, "gpu" + gpu), os.O_RDONLY)
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    clash = ""
except BlockingIOError:
    clash = " clash"

def say(line):
    fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)

say(f"start {job} {gpu}{clash}\\n")
time.sleep(seconds)  # its work
say(f"end {job} {gpu}\\n")
"""


@dataclass
class Person:
    """A real user with a state directory and a work folder of their own."""

    user: User
    home: Path
    env: dict[str, str]
    submitted: list[str] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)  # pids of launchers SIGKILLed

    @property
    def events(self) -> Path:
        return self.home / "events"


class Loop:
    """The box under faults: the root server, two users, and what was done to them."""

    def __init__(self, users: Users, root: Path, seed: int) -> None:
        self.users, self.root, self.rng = users, root, random.Random(seed)
        self.locks = root / "locks"
        self.locks.mkdir(mode=0o755)
        for gpu in range(NUM_GPUS):
            (self.locks / f"gpu{gpu}").touch(mode=0o644)
        group = users.group()
        self.args = ("--gpus", str(NUM_GPUS), "--group", str(group), "--grace", "3")
        self.socket = root / "s.sock"
        self.server = Server(self.socket, *self.args).ready()
        self.people = [self._person(users.user([group])) for _ in range(2)]
        self.job = root / "job.py"  # run by its #! line: argv[0] is a file every user may run
        self.job.write_text(JOB.replace("PYTHON", users.python(self.people[0].user)))
        self.job.chmod(0o755)
        self.faults: Counter[str] = Counter()

    def _person(self, user: User) -> Person:
        home = self.root / user.name
        home.mkdir(mode=0o700)
        os.chown(home, user.uid, user.gid)
        env = self.users.env(
            HOME=str(home), HWPOOL_SOCKET=str(self.socket), HWPOOL_STATE_DIR=str(home / "state"),
            HWPOOL_AUTOSTART="0",
        )  # fmt: skip
        return Person(user, home, env)

    def hwpool(self, person: Person, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.users.command(person.user, ["-m", "hwpool", *args]), env=person.env,
            cwd=person.home, capture_output=True, text=True, timeout=BOUND * 3, check=False,
        )  # fmt: skip

    def submit(self, person: Person) -> None:
        seconds = f"{self.rng.uniform(0.1, 0.8):.2f}"
        command = [str(self.job), str(person.events), str(self.locks), seconds]
        done = self.hwpool(person, "submit", "--gpus", "1", "--", *command)
        assert done.returncode == 0, done.stderr
        person.submitted.append(done.stdout.strip())

    # ------------------------------------------------------------------ faults
    def fault(self) -> None:
        """SIGKILL one part at random: the server (restarted at once), a supervisor (started
        again by the next submit) or a launcher (its job dies with it)."""
        person = self.rng.choice(self.people)
        what = self.rng.choice(["server", "supervisor", "launcher", "launcher"])
        if what == "server":
            self.server.kill()
            self.server = Server(self.socket, *self.args).ready()
        elif what == "supervisor":
            pid = _supervisor_pid(person)
            if pid is None or not _kill(pid):
                return
        else:
            launchers = _launchers(person.user.uid)
            if not launchers:
                return
            pid = self.rng.choice(launchers)
            if not _kill(pid):
                return
            person.killed.add(pid)  # a job records its launcher's pid once it runs
        self.faults[what] += 1

    # ------------------------------------------------------------------ the end
    def jobs(self, person: Person) -> dict[str, dict[str, Any]]:
        done = self.hwpool(person, "jobs", "--all", "--json")
        assert done.returncode == 0, done.stderr
        return {job["id"]: job for job in json.loads(done.stdout)}

    def drain(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Wait (bounded) until every job of both users has finished; their records."""
        for person in self.people:
            self.submit(person)  # starts the supervisor again if the loop killed it
        deadline = time.monotonic() + DRAIN_S
        while True:
            tables = {p.user.name: self.jobs(p) for p in self.people}
            left = [j for t in tables.values() for j in t.values() if not _finished(j)]
            if not left:
                return tables
            if time.monotonic() > deadline:
                logs = "\n".join(_supervisor_log(p) for p in self.people)
                raise AssertionError(f"jobs never finished: {left}\n{logs}")
            time.sleep(0.2)  # a job's record is the only sign of its progress

    def close(self) -> None:
        for person in self.people:
            for pid in [_supervisor_pid(person), *_launchers(person.user.uid)]:
                if pid is not None:
                    _kill(pid)
        self.server.kill()


def _finished(job: dict[str, Any]) -> bool:
    return job["state"] in ("succeeded", "failed", "cancelled", "timed-out", "lost")


def _supervisor_pid(person: Person) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((person.home / "state" / "supervisor.lock").read_text().split()[0])
    return None


def _supervisor_log(person: Person) -> str:
    with contextlib.suppress(OSError):
        return (person.home / "state" / "supervisor.log").read_text()
    return ""


def _launchers(uid: int) -> list[int]:
    """The pids of ``uid``'s job launchers that run now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid == uid and LAUNCHER_MARK in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _events(person: Person) -> list[list[str]]:
    with contextlib.suppress(FileNotFoundError):
        return [line.split() for line in person.events.read_text().splitlines()]
    return []


def _check(loop: Loop, tables: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Every broken promise, in words."""
    wrong: list[str] = []
    for person in loop.people:
        events = _events(person)
        starts = Counter(e[1] for e in events if e[0] == "start")
        ended = {e[1] for e in events if e[0] == "end"}
        wrong += [f"{person.user.name} {e[1]} ran beside a live job on GPU {e[2]}"
                  for e in events if e[0] == "start" and e[-1] == "clash"]  # fmt: skip
        wrong += [f"{person.user.name} {j} started {n} times" for j, n in starts.items() if n > 1]
        for job_id, job in tables[person.user.name].items():
            name, state = f"{person.user.name} {job_id}", job["state"]
            killed = job.get("pid") in person.killed
            if state == "succeeded" and job_id not in ended:
                wrong.append(f"{name} recorded succeeded but never ended: {job}")
            if state in ("failed", "cancelled") and job_id in ended:
                wrong.append(f"{name} ended but recorded {state}: {job}")
            if job_id in ended and not killed and state != "succeeded":
                wrong.append(f"{name} ended, its launcher never killed, but {state}: {job}")
            if state == "lost" and not killed:
                wrong.append(f"{name} recorded lost but its launcher was never killed: {job}")
    return wrong


def _all_free(socket: Path) -> dict[str, Any]:
    """The server's status once it holds no lease (bounded: a revoked or restored lease of a
    dead process is freed within seconds)."""
    deadline = time.monotonic() + 60.0
    while True:
        status = status_of(socket)
        if not status["leases"] and all(g["free"] == 1.0 for g in status["gpus"]):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"leases left held with every job gone: {status}")
        time.sleep(0.2)  # the server's status is the only sign of a hold's end


@pytest.mark.timeout(FAULT_S + DRAIN_S + 120.0)  # the loop, the drain, set-up and checks
def test_random_sigkills_leave_every_gpu_job_and_record_true(users: Users, box_root: Path) -> None:
    seed = int(os.environ.get("TESTS_HWPOOL_FAULT_SEED", str(random.randrange(2**32))))
    print(f"fault loop seed {seed} (TESTS_HWPOOL_FAULT_SEED={seed} replays its choices)")
    box_root.chmod(0o755)
    loop = Loop(users, box_root, seed)
    try:
        for person in loop.people:
            for _ in range(3):
                loop.submit(person)
        end = time.monotonic() + FAULT_S
        while time.monotonic() < end:
            time.sleep(loop.rng.uniform(0.2, 1.5))  # when the next fault lands: the loop's dice
            loop.fault()
            if loop.rng.random() < 0.5:
                loop.submit(loop.rng.choice(loop.people))
        tables = loop.drain()
        for person in loop.people:  # every launcher gone: nothing of a job runs any more
            deadline = time.monotonic() + BOUND
            while _launchers(person.user.uid):
                assert time.monotonic() < deadline, "launchers outlived their jobs"
                time.sleep(0.05)
        _all_free(loop.socket)
        print(f"faults: {dict(loop.faults)}; jobs: "
              + ", ".join(f"{k} {Counter(j['state'] for j in t.values())}"
                          for k, t in tables.items()))  # fmt: skip
        assert sum(loop.faults.values()) > 0, "the loop injected no fault"
        assert _check(loop, tables) == []
        for person in loop.people:  # every job was recorded
            assert set(person.submitted) <= set(tables[person.user.name]), person.submitted
    finally:
        loop.close()


def test_the_checks_catch_each_broken_promise(tmp_path: Path) -> None:
    """The loop's checks fail on what they look for: a job beside a live one on its GPU, a
    job started twice, a success that never ended, an end recorded as anything else, and a
    loss with no launcher killed."""
    user = User("ada", 1, 1)
    person = Person(user, tmp_path, {}, killed={70})
    person.events.write_text(
        "start j1 0\nend j1 0\nstart j2 0 clash\nstart j3 1\nstart j3 1\nstart j4 1\n"
        "end j5 0\nstart j6 0\nstart j7 0\nend j7 0\n"
    )
    loop = Loop.__new__(Loop)
    loop.people = [person]
    records = {
        "j1": "succeeded", "j2": "failed", "j3": "failed", "j4": "succeeded", "j5": "failed",
        "j6": "lost", "j7": "lost",
    }  # fmt: skip
    pids = {"j7": 70}
    table = {j: {"id": j, "state": s, "pid": pids.get(j, 7)} for j, s in records.items()}
    wrong = _check(loop, {"ada": table})
    assert [w.split(":")[0] for w in wrong] == [
        "ada j2 ran beside a live job on GPU 0",
        "ada j3 started 2 times",
        "ada j4 recorded succeeded but never ended",
        "ada j5 ended but recorded failed",
        "ada j5 ended, its launcher never killed, but failed",
        "ada j6 recorded lost but its launcher was never killed",
    ]
    assert _check(loop, {"ada": {"j1": table["j1"], "j7": table["j7"]}}) == wrong[:2]
