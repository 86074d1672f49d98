"""A stand-in for a job's launcher, for the tests of ``hwpool jobs/logs/wait/cancel`` and
``hwpool.Job``, until end-to-end tests use the real launcher (the supervisor's).

It plays the launcher's contract (docs/jobs.md): it marks the job running with its own pid
and start time (``_procs.process_start``), its logs in ``<state dir>/logs/jN.out`` and
``.err`` (mode 0600), and then records the job's end itself; on ``CANCEL_SIGNAL``
(SIGUSR1) it records the job ``cancelled`` (ended by SIGTERM, as a real job would be) and
exits. What the "job" does is driven from the test through stdin, one command a line:

- ``out TEXT`` / ``err TEXT``: append the line TEXT to the job's stdout / stderr log;
- ``exit N``: record the job finished with exit code N, and exit;
- ``signal N``: record it killed by signal N, and exit;
- ``timeout``: record it timed out (SIGTERM), and exit;
- ``die``: exit at once without recording anything (the job is then lost).

Usage: ``python standin_launcher.py STATE_DIR JOB_ID`` for a queued job, or
``python standin_launcher.py STATE_DIR --add NAME`` to add the job first. It prints
``running JOB_ID`` once the job is recorded running, and ``cancelled`` after a cancel.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType

from hwpool._jobs._procs import CANCEL_SIGNAL, process_start
from hwpool._jobs._store import JobStore


def _logs(directory: Path, job_id: str) -> tuple[Path, Path]:
    folder = directory / "logs"
    folder.mkdir(mode=0o700, exist_ok=True)
    paths = folder / f"{job_id}.out", folder / f"{job_id}.err"
    for path in paths:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return paths


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as log:
        log.write(text + "\n")


def main(argv: list[str]) -> int:
    directory = Path(argv[0])
    with JobStore.open(directory) as store:
        if argv[1] == "--add":
            job_id = store.add(["standin"], cwd="/", environment={}, name=argv[2]).id
        else:
            job_id = argv[1]

        def cancel(signum: int, frame: FrameType | None) -> None:
            with JobStore.open(directory) as own:
                own.mark_cancelled(job_id, signal=signal.SIGTERM)
            print("cancelled", flush=True)
            os._exit(0)

        # before the job is recorded running: from then on a cancel may come
        signal.signal(CANCEL_SIGNAL, cancel)
        out, err = _logs(directory, job_id)
        pid = os.getpid()
        start = process_start(pid)
        assert start is not None
        store.mark_running(job_id, pid=pid, pid_start=start, gpu_ids=["GPU-standin-0"],
                           stdout_log=str(out), stderr_log=str(err))  # fmt: skip
    print(f"running {job_id}", flush=True)
    for line in sys.stdin:
        command, _, rest = line.rstrip("\n").partition(" ")
        if command in ("out", "err"):
            _append(out if command == "out" else err, rest)
            continue
        if command == "die":
            os._exit(0)
        with JobStore.open(directory) as store:
            if command == "exit":
                store.mark_finished(job_id, exit_code=int(rest))
            elif command == "signal":
                store.mark_finished(job_id, signal=int(rest))
            elif command == "timeout":
                store.mark_timed_out(job_id, signal=signal.SIGTERM)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
