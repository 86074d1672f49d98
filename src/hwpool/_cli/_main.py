"""The ``hwpool`` command: parse the command line, check the environment, run the command.

Exit status: 0 on success, 2 for bad usage or bad input (a one-line ``hwpool: error: ...`` on
stderr, no traceback), 1 when something the user could not have prevented fails (a benchmark
raised, no benchmarks to run), 130 when interrupted with Ctrl-C. Each subcommand's own
statuses are in its module. Only the parser (``_parser``) and the environment check
(``_env``) are imported here: a command's implementation is loaded when it runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from . import _env, _parser
from ._args import UserError
from ._text import one_line

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hwpool`` command with ``argv`` (default: ``sys.argv[1:]``); return its status."""
    args = _parser.build().parse_args(argv)
    try:
        _check_environment()
        status: int = args.run(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is seen below
    except UserError as exc:
        print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hwpool: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`hwpool ... | head`): not an error of ours
        _quiet_stdout()
        return 0
    return status


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit, which would fail again on the
    closed pipe, writes nowhere (and Python prints no second error)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _check_environment() -> None:
    """Every HWPOOL_* variable, parsed before any command does any work."""
    try:
        _env.check_environment(os.environ)
    except ValueError as exc:  # the message names the variable and its value
        raise UserError(str(exc)) from None
