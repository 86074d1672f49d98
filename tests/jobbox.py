"""A user's view of a box for the ``hwpool submit`` tests: a real server, a private state
directory, real ``hwpool`` processes, and the supervisor and launchers they start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from hostserver import BOUND, ENV, Server
from hwpool._jobs._model import JobRecord, JobState
from hwpool._jobs._store import JobStore
from hwpool._jobs._supervisor import LOCK_NAME

JOB = str(Path(__file__).parent / "run" / "job.py")
LONG_BOUND = 30.0  # a job's whole life under load: submit, supervisor start, grant, launch


class Box:
    """One user's view of a machine for a test: a server, a state directory, a work folder."""

    def __init__(self, server: Server, root: Path) -> None:
        self.server, self.root = server, root
        self.state = root / "state"
        self.work = root / "work"
        self.work.mkdir()
        self.env = {
            **ENV, "HWPOOL_SOCKET": str(server.socket), "HWPOOL_STATE_DIR": str(self.state),
            "HWPOOL_AUTOSTART": "0", "HWPOOL_SYSTEM_SOCKET": "",
        }  # fmt: skip

    def hwpool(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``hwpool ARGS`` as a real process of this user; its result."""
        return subprocess.run(
            [sys.executable, "-m", "hwpool", *args], check=False,
            env=self.env if env is None else env,
            capture_output=True, text=True, timeout=LONG_BOUND, cwd=self.work,
        )  # fmt: skip

    def submit(self, *options: str, job: Iterable[str] = ()) -> str:
        """``hwpool submit OPTIONS -- python job.py WORK NAME WORDS...``; the new job's id."""
        words = list(job)
        done = self.hwpool("submit", *options, "--", sys.executable, JOB, str(self.work), *words)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def job_ids(self) -> list[str]:
        """The ids of every job in the table, newest first."""
        with JobStore.open(self.state) as store:
            return [job.id for job in store.list(include_finished=True)]

    def job(self, job_id: str) -> JobRecord:
        with JobStore.open(self.state) as store:
            return store.get(job_id)

    def until(self, job_id: str, check: Callable[[JobRecord], bool], what: str) -> JobRecord:
        """Wait (bounded) until the job's record passes ``check``; the record."""
        deadline = time.monotonic() + LONG_BOUND
        while True:
            job = self.job(job_id)
            if check(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"{job_id} never {what}: {job}\n{self.supervisor_log()}")
            time.sleep(0.02)  # the table is the only signal a test has of a job's progress

    def finished(self, job_id: str) -> JobRecord:
        return self.until(job_id, lambda job: job.state.finished, "finished")

    def running(self, job_id: str) -> JobRecord:
        return self.until(job_id, lambda job: job.state is JobState.RUNNING, "ran")

    def file(self, name: str) -> Path:
        return self.work / name

    def wait_file(self, name: str) -> Path:
        path = self.work / name
        deadline = time.monotonic() + LONG_BOUND
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} never appeared\n{self.supervisor_log()}")
            time.sleep(0.02)
        return path

    def supervisor_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):  # empty while written
            return int((self.state / LOCK_NAME).read_text().split()[0])
        return None

    def supervisor_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.state / "supervisor.log").read_text()
        return ""

    def kill_all(self) -> None:
        """SIGKILL the supervisor and every launcher and job of this box."""
        pids = [self.supervisor_pid()]
        with contextlib.suppress(Exception), JobStore.open(self.state) as store:
            pids += [job.pid for job in store.list(states=[JobState.RUNNING])]
        for pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # launchers lead their session's group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def wait_gone(pid: int, timeout: float = BOUND) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rfind(")") + 2] in "ZX":
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still runs")
        time.sleep(0.01)
