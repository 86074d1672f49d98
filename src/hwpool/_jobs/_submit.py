"""``hwpool.submit``: queue a job in the user's table and make sure the supervisor runs it."""

from __future__ import annotations

import math
import os
import pwd
import shutil
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path

from .._check import check_bool, check_real, duration_from_text
from .._core._memory import parse_memory
from .._wire._paths import ClientSocket, client_socket
from ._arrays import ArraySpec, parse_array_spec
from ._model import JobRecord, check_argv
from ._servers import check_server
from ._start import ensure_supervisor
from ._state import state_directory
from ._store import JobStore
from ._userconfig import check_notify, default_notify

__all__ = [
    "CommandNotFoundError", "NotExecutableError", "default_name", "submit_job", "submit_jobs",
    "user_name",
]  # fmt: skip

MAX_TIME_S = 2**53


class CommandNotFoundError(ValueError):
    """The job's program is not found where the job will look (``hwpool submit``: 127)."""


class NotExecutableError(ValueError):
    """The job's program is found but is no executable file (``hwpool submit``: 126)."""


MAX_DEFAULT_NAME = 60


def submit_job(
    argv: Sequence[str],
    *,
    gpus: Fraction | int | float | None = None,
    memory: int | str | None = None,
    name: str | None = None,
    priority: int = 0,
    time: float | str | None = None,
    after: Iterable[str] = (),
    after_any: Iterable[str] = (),
    after_notok: Iterable[str] = (),
    hold: bool = False,
    notify: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> JobRecord:
    """Queue ``argv`` as a job of this user; its record as queued.

    ``gpus``: a fraction in (0, 1] of one GPU or an int >= 2 of whole GPUs (default: one
    GPU); or ``memory`` (MiB, or a size such as ``"20GiB"``) of one GPU instead.
    ``time``: a limit (seconds, or ``"90s"``, ``"30m"``, ``"2h"``): past it the job is ended
    and recorded as timed-out. ``after``: job ids that must succeed first; ``after_any``:
    that must have ended, however; ``after_notok``: of which one must end without success
    (see ``_depends``). ``hold``: held from the start (``hwpool release`` lets it run).
    ``notify``: a shell command run once the job has ended (see ``_notify``; default: the
    user's ``notify`` setting, ``_userconfig``; ``""``: none).
    ``cwd`` and ``env``: default this process's. Bad values raise TypeError or ValueError
    naming the argument, and queue nothing.
    """
    return submit_jobs(
        [check_argv(argv)], gpus=gpus, memory=memory, names=[name], priority=priority,
        time=time, after=after, after_any=after_any, after_notok=after_notok, hold=hold,
        notify=notify, cwd=cwd, env=env, state_dir=state_dir,
    )[0]  # fmt: skip


def submit_jobs(
    commands: Sequence[Sequence[str]],
    *,
    gpus: Fraction | int | float | None = None,
    memory: int | str | None = None,
    names: Sequence[str | None] | None = None,
    priority: int = 0,
    time: float | str | None = None,
    after: Iterable[str] = (),
    after_any: Iterable[str] = (),
    after_notok: Iterable[str] = (),
    hold: bool = False,
    notify: str | None = None,
    array: str | ArraySpec | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    server: ClientSocket | None = None,
) -> list[JobRecord]:
    """Queue one job per command of ``commands`` (each an argv), all with the same other
    fields (see :func:`submit_job`), in one transaction: all of them or, on any bad value,
    none (the error names the command by its index); their records, in order.

    The jobs wait on ``server`` (default: the server this process would use): a
    ``ServerConflictError`` (a ValueError naming both sockets) when the user's supervisor
    serves another one (see ``_servers``). ``array`` (``"0-99%4"``, see ``_arrays``; with one
    command): one job per index, the array's members."""
    if gpus is not None and memory is not None:
        raise ValueError(f"give gpus or memory, not both (gpus={gpus!r}, memory={memory!r})")
    memory_mib = None if memory is None else parse_memory(memory, "memory")
    environment = dict(os.environ if env is None else env)
    folder = os.path.abspath(os.getcwd() if cwd is None else os.fspath(cwd))
    if not os.path.isdir(folder):
        raise ValueError(f"cwd must be a directory, got {str(folder)!r}")
    dependencies, of_any, of_notok = (
        [ids] if isinstance(ids, str) else list(ids) for ids in (after, after_any, after_notok)
    )
    check_bool("hold", hold)
    spec = parse_array_spec(array, "array") if isinstance(array, str) else array
    if spec is not None and len(commands) != 1:
        raise ValueError(f"array takes one command, got {len(commands)} (--from and --array)")
    notifier = default_notify(os.environ) if notify is None else check_notify(notify)
    chosen = [None] * len(commands) if names is None else list(names)
    if len(chosen) != len(commands):
        raise ValueError(f"names must name each of the {len(commands)} commands, got {names!r}")
    batch: list[tuple[Sequence[str], str | None]] = []
    for index, argv in enumerate(commands):
        where = "" if len(commands) == 1 else f"command {index + 1}: "
        try:
            command = check_argv(argv)
            if not (dependencies or of_any or of_notok):  # a dependency may build the program
                _check_program(command[0], folder, environment)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}{exc}") from None
        batch.append((command, chosen[index] or default_name(command)))
    directory = state_directory() if state_dir is None else Path(os.fspath(state_dir))
    target = client_socket() if server is None else server
    with JobStore.open(directory) as store:
        check_server(directory, store, target.path)
        jobs = store.add_all(
            batch, cwd=folder, environment=environment, gpus=gpus, memory_mib=memory_mib,
            priority=priority, time_limit=_time_limit(time), after=dependencies,
            after_any=of_any, after_notok=of_notok, held_by=user_name() if hold else None,
            notify=notifier, array=spec,
        )  # fmt: skip
    ensure_supervisor(directory, target)
    return jobs


def user_name() -> str:
    """This process's user's name (its uid as text where the user database has none): who
    holds a job it holds."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def default_name(argv: Sequence[str]) -> str:
    """A job's name when none is given: its command's first two words, as file names
    (``python train.py``, ``sleep 30``): the command's name alone says too little when it is
    an interpreter."""
    words = [os.path.basename(argv[0]) or argv[0]]
    if len(argv) > 1 and not argv[1].startswith("-"):
        words.append(os.path.basename(argv[1].rstrip("/")) or argv[1])
    return " ".join(words)[:MAX_DEFAULT_NAME]


def _time_limit(value: float | str | None) -> int | None:
    """``time`` in whole seconds (rounded up: a job is never ended before its limit)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            seconds = duration_from_text(value)
        except ValueError as exc:
            raise ValueError(f"time {exc}") from None
    else:
        seconds = check_real("time", value)
    if not 0 < seconds < MAX_TIME_S:
        raise ValueError(f"time must be a number of seconds > 0, got {value!r}")
    return math.ceil(seconds)


def _check_program(program: str, cwd: str, environment: Mapping[str, str]) -> None:
    """ValueError unless ``program`` names an executable file, found as the job will find
    it (on the job's PATH, or relative to its working directory)."""
    if os.sep in program:
        found: str | None = os.path.join(cwd, program)
    else:
        found = shutil.which(program, path=environment.get("PATH", os.defpath))
    if found is None or not os.path.exists(found):
        raise CommandNotFoundError(
            f"argv[0]: command {program!r} not found (on the job's PATH, from {cwd!r})"
        )
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise NotExecutableError(f"argv[0]: {program!r} is not an executable file ({found!r})")
