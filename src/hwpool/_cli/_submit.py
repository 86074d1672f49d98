"""``hwpool submit``: queue a job that runs when its share is granted, detached from the
terminal (see docs/jobs.md)."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import Any

from .._jobs._model import check_job_id
from .._jobs._start import logout_warning
from .._jobs._submit import submit_job
from .._wire._bounds import MAX_PRIORITY
from .._wire._safety import UnsafePathError
from . import _run
from ._child import say
from ._text import one_line

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add ``submit`` to the ``hwpool`` subcommands."""
    submit = commands.add_parser(
        "submit", help="queue a command to run on a share of the GPUs, after you log out too",
        usage="hwpool submit [-h] [--gpus G | --mem SIZE] [--name NAME] [--priority P] "
        "[--time LIMIT] [--after ID[,ID...]] [--cwd DIR] [--json] -- CMD [ARGS...]",
        description="Queue CMD as a job of yours and print its id (j1, j2, ...) at once. Your "
        "supervisor (started if none runs, detached from the terminal) runs it when the jobs "
        "it comes --after have succeeded and its share is granted, with this shell's "
        "environment and working directory, stdin from /dev/null, its output to `hwpool logs`.",
    )  # fmt: skip
    submit.add_argument(
        "--gpus", type=_run.demand_from_text, metavar="G",
        help="a fraction in (0, 1] of one GPU, or an integer >= 2 of whole GPUs (default 1)",
    )  # fmt: skip
    submit.add_argument(
        "--mem", type=_run.memory_from_text, metavar="SIZE",
        help="SIZE of one GPU's memory instead (6GiB, 512MiB), on a server sized in memory",
    )  # fmt: skip
    submit.add_argument("--name", metavar="NAME", help="a name (default: the command's name)")
    submit.add_argument(
        "--priority", type=_run.priority_from_text, default=0, metavar="P",
        help=f"an int in -{MAX_PRIORITY}..{MAX_PRIORITY} (default 0): higher goes first among "
        "your own jobs; it never passes another user's",
    )  # fmt: skip
    submit.add_argument(
        "--time", type=_run.limit_from_text, metavar="LIMIT",
        help="a time limit once it runs (90s, 30m, 2h, 1d): past it the job gets SIGTERM, "
        "SIGKILL 10 s later, and is recorded as timed-out",
    )  # fmt: skip
    submit.add_argument(
        "--after", type=_job_ids, action="extend", default=[], metavar="ID[,ID...]",
        help="run only after these jobs of yours have succeeded (if one does not, this one is "
        "cancelled, never run)",
    )  # fmt: skip
    submit.add_argument("--cwd", metavar="DIR", help="the working directory (default: this one)")
    submit.add_argument("--json", action="store_true", help="print the job as JSON")
    submit.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    submit.set_defaults(run=_cmd_submit)


def _job_ids(text: str) -> list[str]:
    ids = [word.strip() for word in text.split(",")]
    for word in ids:
        try:
            check_job_id("--after", word)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("--after ")) from None
    return ids


def _cmd_submit(args: argparse.Namespace) -> int:
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
