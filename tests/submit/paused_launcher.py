"""The real launcher (``hwpool._cli._launch``), held at a step of the hand-over while a file
says so, for the tests that SIGKILL a launcher or a supervisor there.

``paused_launcher.py STEPS STATE_DIR`` (the hand-over on stdin, as the supervisor writes it).
At step ``take`` (before ``take_over``) and step ``taken`` (after it, before the job is
recorded running), while ``STEPS/pause-STEP`` exists, it writes ``STEPS/STEP.PID`` and waits
until ``STEPS/go-STEP`` exists (60 s at most: then it exits 4). The rest is the launcher's.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hwpool._cli import _launch
from hwpool._gpu._lease import GPULease
from hwpool._gpu._pool import GPUPool

BOUND = 60.0
STEPS = Path(sys.argv[1])


def pause(step: str) -> None:
    if not (STEPS / f"pause-{step}").exists():
        return
    (STEPS / f"{step}.{os.getpid()}").write_text("")
    deadline = time.monotonic() + BOUND
    while not (STEPS / f"go-{step}").exists():
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.02)  # a file is the only signal the test gives


_take_over = GPUPool.take_over


def paused_take_over(self: GPUPool, lease_id: int, ticket: str) -> GPULease:
    pause("take")
    lease = _take_over(self, lease_id, ticket)
    pause("taken")
    return lease


GPUPool.take_over = paused_take_over  # type: ignore[method-assign]
raise SystemExit(_launch.main(sys.argv[2:]))
