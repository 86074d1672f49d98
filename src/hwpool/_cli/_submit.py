"""``hwpool submit``: queue a job that runs when its share is granted, detached from the
terminal (see docs/jobs.md).

Before anything is queued, the server the shell chose (``--socket``, else as ``hwpool run``
chooses it) is asked, as the supervisor will ask it: a job no one could ever run there is
refused now, with nothing queued, rather than left to wait for ever. Exit status
(``hwpool._exits``): 0 with the jobs' ids printed; 2 for bad usage or input (a request that
server could never grant, a supervisor that serves another server); 77 when that server
does not serve this user (not a member of its group); 125 when no server answers; 126 / 127
when the command is no executable file / is not found (as ``hwpool run``).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shlex
import sys

from .. import _exits
from .._jobs._servers import check_server
from .._jobs._start import logout_warning
from .._jobs._state import state_directory
from .._jobs._submit import CommandNotFoundError, NotExecutableError, submit_jobs
from .._wire._paths import client_socket
from ._child import say
from ._submit_check import ServerRefusal, check_request
from ._text import one_line

__all__ = ["cmd_submit"]


def cmd_submit(args: argparse.Namespace) -> int:
    """``hwpool submit``: its exit status (see the module)."""
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.batch is not None and (argv or args.name is not None):
        return _usage("--from FILE takes the commands from FILE: give no -- CMD, nor --name "
                      "(each job is named after its command)")  # fmt: skip
    if args.batch is None and not argv:
        return _usage("give the command: hwpool submit [OPTIONS] -- CMD [ARGS...]")
    if args.gpus is not None and args.mem is not None:
        return _usage(f"give --gpus or --mem, not both (--gpus {args.gpus}, --mem {args.mem} MiB)")
    try:
        server = client_socket(args.socket)
    except ValueError as exc:
        return _usage(str(exc).replace("socket:", "--socket:", 1))
    try:
        commands = [argv] if args.batch is None else _commands_from(args.batch)
        check_server(state_directory(), None, server.path)  # before a server is started
        check_request(server, args.gpus, args.mem)
        jobs = submit_jobs(
            commands, gpus=args.gpus, memory=args.mem, names=[args.name] * len(commands),
            priority=args.priority, time=args.time, after=args.after,
            after_any=args.after_any, after_notok=args.after_notok, hold=args.hold,
            notify=args.notify, array=args.array, cwd=args.cwd,
            env={**os.environ, **dict(args.env)}, server=server,
        )  # fmt: skip
    except ServerRefusal as exc:
        return _error(exc.status, str(exc))
    except CommandNotFoundError as exc:
        return _error(_exits.NOT_FOUND, str(exc))
    except NotExecutableError as exc:
        return _error(_exits.CANNOT_RUN, str(exc))
    except (TypeError, ValueError, LookupError, OSError) as exc:
        return _usage(str(exc))
    warning = logout_warning(getpass.getuser())
    if warning is not None:
        say(f"hwpool submit: warning: {warning}")
    if args.array is not None:  # one line: the array's id
        array_id = jobs[0].array_id
        members = [job.id for job in jobs]
        print(json.dumps({"id": array_id, "members": members}) if args.json else array_id)
    for job in jobs if args.array is None else ():
        if args.json:
            print(json.dumps({"id": job.id, "state": job.state.value, "name": job.name}))
        else:
            print(job.id)
    sys.stdout.flush()
    return 0


def _usage(message: str) -> int:
    return _error(_exits.USAGE, message)


def _error(status: int, message: str) -> int:
    say(f"hwpool: error: submit: {one_line(message)}")
    return status


def _commands_from(path: str) -> list[list[str]]:
    """``--from FILE`` (``-``: stdin): one command per line, split as a shell splits words
    (``shlex``: quotes, no expansion); empty lines and ``#`` comments skipped. ValueError
    naming the line for one that cannot be split, or for a file without commands."""
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    commands = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            commands.append(shlex.split(line))
        except ValueError as exc:
            raise ValueError(f"--from {path}: line {number}: {exc}: {line[:80]!r}") from None
    if not commands:
        raise ValueError(f"--from {path}: no command in it")
    return commands
