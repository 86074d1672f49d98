"""``hwpool submit``: queue a job that runs when its share is granted, detached from the
terminal (see docs/jobs.md)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys

from .._jobs._start import logout_warning
from .._jobs._submit import submit_job
from .._wire._safety import UnsafePathError
from ._child import say
from ._text import one_line

__all__ = ["cmd_submit"]


def cmd_submit(args: argparse.Namespace) -> int:
    """``hwpool submit``: 0 with the job's id printed, 2 for bad usage or input."""
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        say("hwpool: error: submit: give the command: hwpool submit [OPTIONS] -- CMD [ARGS...]")
        return 2
    if args.gpus is not None and args.mem is not None:
        say(f"hwpool: error: submit: give --gpus or --mem, not both (--gpus {args.gpus}, "
            f"--mem {args.mem} MiB)")  # fmt: skip
        return 2
    try:
        job = submit_job(
            argv, gpus=args.gpus, memory=args.mem, name=args.name, priority=args.priority,
            time=args.time, after=args.after, cwd=args.cwd, env=os.environ,
        )  # fmt: skip
    except (TypeError, ValueError, LookupError, UnsafePathError) as exc:
        say(f"hwpool: error: submit: {one_line(str(exc))}")
        return 2
    warning = logout_warning(getpass.getuser())
    if warning is not None:
        say(f"hwpool submit: warning: {warning}")
    if args.json:
        print(json.dumps({"id": job.id, "state": job.state.value, "name": job.name}))
    else:
        print(job.id)
    sys.stdout.flush()
    return 0
