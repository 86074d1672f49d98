"""Notifiers: the command a job asked to run once it has ended (``submit --notify``), run by
its user's supervisor, at most once, off the job's record and the queue.

Each runs as ``sh -c CMD`` in a session of its own, in the job's working directory (the
user's home if it is gone), with the job's environment plus ``HWPOOL_JOB_ID``,
``HWPOOL_JOB_NAME``, ``HWPOOL_JOB_STATE`` and ``HWPOOL_JOB_EXIT`` (its exit code or signal
name, empty when none), the job's JSON record (``hwpool jobs --json``'s) on its stdin, and
its output thrown away. One that runs past :data:`NOTIFY_TIMEOUT_S`
(``HWPOOL_NOTIFY_TIMEOUT``, a duration, in the supervisor's environment) is killed (its
whole process group). Nothing a notifier does (fail, hang, print) changes the job's record
or delays another job: the supervisor only starts it and looks at it when it looks at the
table.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .._check import duration_from_text
from ._json import exit_text, job_json
from ._model import JobRecord

__all__ = ["NOTIFY_TIMEOUT_S", "NOTIFY_TIMEOUT_VAR", "Notifiers", "notify_timeout_from_env"]

NOTIFY_TIMEOUT_S = 60.0
NOTIFY_TIMEOUT_VAR = "HWPOOL_NOTIFY_TIMEOUT"


def notify_timeout_from_env(environ: Mapping[str, str]) -> float:
    """``HWPOOL_NOTIFY_TIMEOUT`` (a duration; unset or empty: :data:`NOTIFY_TIMEOUT_S`);
    ValueError naming the variable otherwise."""
    raw = environ.get(NOTIFY_TIMEOUT_VAR, "")
    if raw == "":
        return NOTIFY_TIMEOUT_S
    try:
        return duration_from_text(raw)
    except ValueError as exc:
        raise ValueError(f"{NOTIFY_TIMEOUT_VAR} {exc}") from None


@dataclass
class _Running:
    job_id: str
    process: subprocess.Popen[bytes]
    deadline: float


class Notifiers:
    """The notifiers running for one supervisor; ``log`` hears one line per notifier's end."""

    def __init__(self, log: Callable[[str], None], timeout_s: float = NOTIFY_TIMEOUT_S) -> None:
        self._log, self._timeout_s = log, timeout_s
        self._running: list[_Running] = []

    @property
    def busy(self) -> bool:
        """Whether one still runs."""
        return bool(self._running)

    def start(self, job: JobRecord, user: str) -> None:
        """Run ``job``'s notify command (see the module); a failure to start it is logged."""
        assert job.notify is not None
        env = {**job.environment, "HWPOOL_JOB_ID": job.id, "HWPOOL_JOB_NAME": job.name,
               "HWPOOL_JOB_STATE": job.shown_state, "HWPOOL_JOB_EXIT": exit_text(job)}  # fmt: skip
        cwd = job.cwd if os.path.isdir(job.cwd) else str(Path.home())
        record = json.dumps(job_json(job, user, time.time())).encode()
        try:
            with tempfile.TemporaryFile() as stdin:
                stdin.write(record + b"\n")
                stdin.seek(0)
                process = subprocess.Popen(
                    ["/bin/sh", "-c", job.notify], stdin=stdin, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, cwd=cwd, env=env, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            self._log(f"{job.id}: its notify command could not start: {exc}")
            return
        self._running.append(_Running(job.id, process, time.monotonic() + self._timeout_s))

    def reap(self) -> None:
        """Collect the notifiers that ended; kill those past their time (logged)."""
        now = time.monotonic()
        left = []
        for running in self._running:
            code = running.process.poll()
            if code is None and now >= running.deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(running.process.pid, signal.SIGKILL)
                code = running.process.wait()
                self._log(f"{running.job_id}: its notify command ran past "
                          f"{self._timeout_s:g} s: killed")  # fmt: skip
            elif code is not None and code != 0:
                self._log(f"{running.job_id}: its notify command exited {code}")
            if code is None:
                left.append(running)
        self._running = left

    def stop(self) -> None:
        """Kill every notifier still running (the supervisor exits)."""
        for running in self._running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(running.process.pid, signal.SIGKILL)
            running.process.wait()
        self._running = []
