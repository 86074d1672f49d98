"""``hwpool jobs``, ``logs``, ``wait`` and ``retry``, and the job half of ``hwpool cancel``.

Job ids look like ``j12``; the plain numbers that ``hwpool status`` shows (``#12``) and
``hwpool cancel 12`` takes are the host server's request and lease ids. Each command reads
the caller's own job table (``HWPOOL_STATE_DIR``, else ``$XDG_STATE_HOME/hwpool``, else
``~/.local/state/hwpool``), never creating it just to read it; root may read other users'
tables with ``hwpool jobs --user NAME`` or ``--all-users`` (read-only, see
``hwpool._jobs._others``).

Errors are one line ``hwpool: error: ...``: exit 2 for bad usage or input (a malformed or
unknown job id, retry of a job not finished), 1 when the table or a log cannot be used (an
unsafe path, a table of a newer hwpool). ``wait`` exits with the jobs' statuses (see
:func:`hwpool._jobs._control.exit_status` and docs/jobs.md). The logic is in ``_jobs``
(``_control``, ``_logs``, ``_others``, ``_handle``), shared with :class:`hwpool.Job`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pwd
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from .. import _exits
from .._jobs._control import POLL_S, Watch, exit_status, wait_for
from .._jobs._handle import open_table, start_supervisor, wake_supervisor
from .._jobs._json import exit_text, job_json, ran_s, waited_s
from .._jobs._logs import CHUNK, LogNotStartedError, log_path, open_log
from .._jobs._model import FINISHED, JobRecord, JobState
from .._jobs._others import default_state_directory, read_user_jobs
from .._jobs._schema import JobTableError
from .._jobs._store import JobStateError, JobStore, UnknownJobError
from .._jobs._submit import user_name
from .._wire._safety import UnsafePathError
from ._args import JOB_ID_NOTE, WAIT_TIMED_OUT
from ._as_user import run_as
from ._job_table import CancelRefused, cancel_jobs, expanded
from ._job_table import JobUsageError as _Usage
from ._job_table import job_directory as _directory
from ._job_table import job_table as _table
from ._job_table import one_line_message as _message
from ._jobs_waits import JobWait, job_waits, wait_json
from ._text import one_line, printable
from ._waitwhy import wait_words

__all__ = ["RECENT_S", "WAIT_TIMED_OUT", "CancelRefused", "cancel_jobs", "cmd_cancel",
           "cmd_hold", "cmd_jobs", "cmd_logs", "cmd_release", "cmd_retry", "cmd_update",
           "cmd_wait", "duration", "format_jobs", "job_json"]  # fmt: skip

RECENT_S = 24 * 3600.0
"""``hwpool jobs`` without ``--all`` shows the jobs that finished within this many seconds."""
NAME_WIDTH = 24
ID_NOTE = JOB_ID_NOTE


class _Broken(Exception):
    """The table or a log cannot be used: one line on stderr, exit status 1."""


def _guarded(
    command: Callable[[argparse.Namespace], int], broken: int = _exits.FAILED
) -> Callable[[argparse.Namespace], int]:
    """``command`` with the errors of the module reported in one line: exit 2 for bad usage,
    ``broken`` when the table or a log cannot be used (1; 125 for ``wait``, whose status may
    be a job's 1)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (_Usage, UnknownJobError, JobStateError) as exc:
            print(f"hwpool: error: {_message(exc)}", file=sys.stderr)
            return _exits.USAGE
        except (_Broken, UnsafePathError, JobTableError) as exc:
            print(f"hwpool: error: {_message(exc)}", file=sys.stderr)
            return broken
        except BrokenPipeError:  # our reader went away (`| head`): main() ends quietly
            raise
        except OSError as exc:  # a folder or file closed to this user, say
            where = "" if exc.filename is None else f"{str(exc.filename)!r}: "
            print(f"hwpool: error: cannot read {one_line(where)}{exc.strerror}", file=sys.stderr)
            return broken

    return run


def _one_job(store: JobStore, job_id: str) -> JobRecord:
    """The one job ``job_id`` names; a usage error for an array of several."""
    members = store.members(job_id)
    if len(members) > 1:
        raise _Usage(f"{job_id} is an array of {len(members)} jobs: give one of its members "
                     f"({members[0]}, ...)")  # fmt: skip
    return store.get(members[0])


# ----------------------------------------------------------------- jobs
def _cmd_jobs(args: argparse.Namespace) -> int:
    now = time.time()
    rows, problems = _gather(args)
    if args.ids:  # these jobs only, whenever they ended
        wanted = set(args.ids)
        rows = [(user, job) for user, job in rows if _named(job, wanted)]
    window = None if args.all or args.ids else RECENT_S if args.since is None else args.since
    if window is not None:
        rows = [(user, job) for user, job in rows if _recent(job, now, window)]
    if args.state is not None:
        rows = [(user, job) for user, job in rows if job.shown_state in args.state]
    waits = job_waits(rows)
    if args.json:
        shown = [{**job_json(job, user, now), **wait_json(waits.get((user, job.id)))}
                 for user, job in rows]  # fmt: skip
        print(json.dumps(shown, indent=1))
    else:
        admin = args.user is not None or args.all_users
        print(format_jobs(rows, now, with_user=admin, window=window, waits=waits))
    for problem in problems:
        print(f"hwpool: error: {one_line(problem)}", file=sys.stderr)
    return 1 if problems else 0


def _named(job: JobRecord, wanted: set[str]) -> bool:
    """Whether ``job`` is one of ``wanted``: its id, its own number's, or its array's."""
    return bool({job.id, f"j{job.number}", job.array_id} & wanted)


def _recent(job: JobRecord, now: float, window: float) -> bool:
    return job.state not in FINISHED or (job.ended_at or now) >= now - window


def _gather(args: argparse.Namespace) -> tuple[list[tuple[str, JobRecord]], list[str]]:
    """The jobs to show, each with its user's name, and the users whose table could not be
    read (with why)."""
    if args.user is None and not args.all_users:
        with _own_table() as store:
            jobs = [] if store is None else store.list(include_finished=True)
        me = _me()
        return [(me, job) for job in jobs], []
    _need_root("--user" if args.user is not None else "--all-users")
    if args.user is not None:
        try:
            users = [pwd.getpwnam(args.user)]
        except KeyError:
            raise _Usage(f"--user: no user named {args.user!r}") from None
    else:
        users = _distinct_homes(pwd.getpwall())
    rows: list[tuple[str, JobRecord]] = []
    problems: list[str] = []
    for user in users:
        try:
            found = read_user_jobs(user, include_finished=True)
        except (UnsafePathError, JobTableError, OSError) as exc:
            problems.append(f"{user.pw_name}'s jobs were not read: {exc}")
            continue
        rows += [(user.pw_name, job) for job in found]
    return rows, problems


def _distinct_homes(entries: Sequence[pwd.struct_passwd]) -> list[pwd.struct_passwd]:
    """The users to read for ``--all-users``: one per uid, and one per home (system users
    often share ``/`` or ``/nonexistent``; of users who share a home with a job table, its
    owner, the only one whose table it can be)."""
    first: dict[int, pwd.struct_passwd] = {}
    for user in entries:
        first.setdefault(user.pw_uid, user)  # the first name of a uid, as getpwuid gives
    by_home: dict[str, list[pwd.struct_passwd]] = {}
    for user in first.values():
        by_home.setdefault(user.pw_dir, []).append(user)
    chosen = []
    for sharing in by_home.values():
        if len(sharing) == 1:
            chosen += sharing
            continue
        try:
            owner = os.lstat(default_state_directory(sharing[0])).st_uid
        except OSError:
            continue  # no state directory there: no jobs to show
        chosen += [user for user in sharing if user.pw_uid == owner] or sharing[:1]
    return chosen


@contextmanager
def _own_table() -> Iterator[JobStore | None]:
    store = open_table(_directory())
    if store is None:
        yield None
        return
    with store:
        yield store


def _need_root(option: str) -> None:
    if os.geteuid() != 0:
        raise _Usage(
            f"{option} reads other users' job tables: only root may (you are uid "
            f"{os.geteuid()}); `hwpool jobs` shows your own"
        )


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


_HEADINGS = ("ID", "NAME", "STATE", "EXIT", "GPUS", "QUEUED", "STARTED", "ENDED", "WAITED",
             "RAN", "REASON")  # fmt: skip


def format_jobs(
    rows: Sequence[tuple[str, JobRecord]],
    now: float,
    *,
    with_user: bool,
    window: float | None = RECENT_S,
    waits: Mapping[tuple[str, str], JobWait] | None = None,
) -> str:
    """The jobs as a table (newest first), every text another user chose escaped, with the
    note on ids under it; ``window``: how long ago the finished jobs shown may have ended
    (None: every job kept is shown)."""
    within = "24 h" if window == RECENT_S else duration(window or 0)
    if not rows:
        table = ["no jobs" + ("" if window is None else " (queued, running or finished in the "
                 f"last {within}; --all: every job kept)")]  # fmt: skip
    else:
        cells = [_cells(job, user, now, with_user, (waits or {}).get((user, job.id)))
                 for user, job in rows]  # fmt: skip
        headings = (("USER",) if with_user else ()) + _HEADINGS
        widths = [max(len(row[i]) for row in [headings, *cells]) for i in range(len(headings))]
        table = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in [headings, *cells]
        ]
    shown = "" if window is None else f"; finished jobs older than {within}: hwpool jobs --all"
    return "\n".join([*table, f"({ID_NOTE}{shown})"])


def _cells(
    job: JobRecord, user: str, now: float, with_user: bool, wait: JobWait | None = None
) -> tuple[str, ...]:
    name = printable(job.name)
    if len(name) > NAME_WIDTH:
        name = name[: NAME_WIDTH - 1] + "~"
    ran = ran_s(job, now)
    cells = (
        job.id, name, job.shown_state, exit_text(job) or "-",
        ",".join(_short_gpu(g) for g in job.gpu_ids) or "-", _clock(job.queued_at, now),
        _clock(job.started_at, now), _clock(job.ended_at, now),
        duration(waited_s(job, now)), "-" if ran is None else duration(ran),
        printable(job.reason or (f"held by {job.held_by}" if job.held_by else "")
                  or _waiting(wait, now)),
    )  # fmt: skip
    return ((printable(user),) if with_user else ()) + cells


def _waiting(wait: JobWait | None, now: float) -> str:
    """``priority; starts in about 3 min (14:03:12)``: why a queued job waits, as the server
    says (a waiting job: ``dependency; start unknown``)."""
    if wait is None:
        return ""
    return wait_words({"reason": wait.reason, "estimated_start": wait.estimated_start}, now,
                      detail=False)  # fmt: skip


def _short_gpu(gpu_id: str) -> str:
    """``GPU-8f2c1a3b`` for a UUID (``--json`` has it whole); other ids as they are."""
    return printable(gpu_id[:12] if gpu_id.startswith(("GPU-", "MIG-")) else gpu_id)


def _clock(stamp: float | None, now: float) -> str:
    """``14:02:11`` today, ``Dec 03 14:02`` on another day (local time); ``-`` for none."""
    if stamp is None:
        return "-"
    moment, today = time.localtime(stamp), time.localtime(now)
    if moment[:3] == today[:3]:
        return time.strftime("%H:%M:%S", moment)
    return time.strftime("%b %d %H:%M", moment)


def duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``3d04h``: a duration as people read it."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


# ----------------------------------------------------------------- logs
def _cmd_logs(args: argparse.Namespace) -> int:
    with _table([args.id]) as store:
        record = _one_job(store, args.id)
        try:
            if args.follow:
                return _follow(store, record, args.stderr)
            return _print_log(record, args.stderr)
        except KeyboardInterrupt:  # Ctrl-C ends following: quietly, as tail -f does
            return 130


def _print_log(record: JobRecord, stderr: bool) -> int:
    try:
        fd = _open(log_path(record, stderr), record)
    except LogNotStartedError as exc:
        print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    with os.fdopen(fd, "rb") as log:
        while chunk := log.read(CHUNK):
            sys.stdout.buffer.write(chunk)
    return 0


def _open(path: Path, record: JobRecord) -> int:
    """The checked log ``path`` of ``record``; an error (exit 1) when it is missing."""
    try:
        return open_log(path)
    except FileNotFoundError:
        raise _Broken(f"{record.id}'s log {str(path)!r} is missing (removed?)") from None


def _follow(store: JobStore, record: JobRecord, stderr: bool) -> int:
    """Print the log as it grows until the job has finished and all it wrote is shown."""
    record = _until_started(store, record)
    try:
        path = log_path(record, stderr)
    except LogNotStartedError as exc:
        print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    watch = Watch(store, [record])
    fd = None
    while fd is None:  # the launcher makes the file as it starts the job
        try:
            fd = open_log(path)
        except FileNotFoundError:
            if _finished(watch):
                return _print_log(watch.records[record.id], stderr)
            time.sleep(POLL_S)
    with os.fdopen(fd, "rb") as log:
        out = sys.stdout.buffer
        finished = False
        while True:
            chunk = log.read(CHUNK)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            if finished:  # drained after the end was recorded: all of it is shown
                return 0
            finished = _finished(watch)
            if not finished:
                time.sleep(POLL_S)


def _until_started(store: JobStore, record: JobRecord) -> JobRecord:
    """``record`` once the job has left the queue (started, or finished without)."""
    if record.state not in (JobState.QUEUED, JobState.WAITING):
        return record
    print(f"hwpool logs: {record.id} is {record.state.value}: waiting for it to start",
          file=sys.stderr)  # fmt: skip
    watch = Watch(store, [record])
    while watch.records[record.id].state in (JobState.QUEUED, JobState.WAITING):
        time.sleep(POLL_S)
        watch.refresh()
    return watch.records[record.id]


def _finished(watch: Watch) -> bool:
    """Whether the one job ``watch`` watches has finished (read again first)."""
    watch.refresh()
    return not watch.pending()


# ----------------------------------------------------------------- wait
def _cmd_wait(args: argparse.Namespace) -> int:
    with _table(args.ids) as store:
        ids = list(expanded(store, args.ids))  # every id known before any wait
        try:
            records = wait_for(store, ids, args.timeout)
        except TimeoutError as exc:
            print(f"hwpool: error: wait: --timeout {args.timeout:g} s passed: {exc}",
                  file=sys.stderr)  # fmt: skip
            return WAIT_TIMED_OUT
    status = 0
    for job_id in ids:
        record = records[job_id]
        code = exit_status(record)
        print(f"{job_id}: {_outcome(record)} (status {code})")
        if code and not status:
            status = code
    return status


def _outcome(record: JobRecord) -> str:
    """``succeeded``, ``failed (exit 3)``, ``cancelled (SIGTERM)``, ``lost: why``."""
    shown = exit_text(record)
    if record.state is JobState.FAILED:
        return f"failed ({'exit ' if record.signal is None else ''}{shown})"
    if record.state is JobState.SUCCEEDED:
        return "succeeded"
    detail = f" ({shown})" if shown else ""
    reason = f": {printable(record.reason)}" if record.reason else ""
    return f"{record.state.value}{detail}{reason}"


# ----------------------------------------------------------------- retry
def _cmd_retry(args: argparse.Namespace) -> int:
    with _table([args.id]) as store:
        again = store.retry(_one_job(store, args.id).id)
    start_supervisor(_directory())
    if args.json:
        print(json.dumps({"id": again.id, "retry_of": args.id, "state": again.state.value}))
    else:
        print(f"{again.id}: a retry of {args.id}, {again.state.value}")
    return 0


# ----------------------------------------------------------------- update
_EDITS = {"name": "--name", "priority": "--priority", "time": "--time", "gpus": "--gpus",
          "mem": "--mem"}  # fmt: skip


def _cmd_update(args: argparse.Namespace) -> int:
    """``hwpool update ID [--priority P] [--time LIMIT] [--gpus G | --mem SIZE] [--name N]``:
    a queued (or waiting) job edited in place; its supervisor asks for its share again."""
    given = [option for field, option in _EDITS.items() if getattr(args, field) is not None]
    if not given:
        raise _Usage("give what to change: --priority, --time, --gpus, --mem or --name")
    if args.gpus is not None and args.mem is not None:
        raise _Usage(f"give --gpus or --mem, not both (--gpus {args.gpus}, --mem {args.mem} MiB)")
    with _table([args.id]) as store:
        targets = list(expanded(store, [args.id]))
        if len(targets) == 1 and store.get(targets[0]).state is JobState.RUNNING:
            raise JobStateError(
                f"{args.id} is running: its {', '.join(given)} cannot change now (a running "
                "job's time limit cannot change yet either: cancel and resubmit it)"
            )
        if len(targets) > 1:  # an array: its members that still wait
            targets = _waiting_ones(store, [args.id], "can be changed")
        time_limit = None if args.time is None else math.ceil(args.time)
        edited = [
            store.update(job_id, name=args.name, priority=args.priority, time_limit=time_limit,
                         gpus=args.gpus, memory_mib=args.mem)
            for job_id in targets
        ]  # fmt: skip
    start_supervisor(_directory())
    for record in edited:
        print(f"{record.id}: updated {', '.join(given)}")
    return 0


# ----------------------------------------------------------------- hold, release
def _cmd_hold(args: argparse.Namespace) -> int:
    """``hwpool hold ID...``: every id must name a queued or waiting job (checked for all
    before any is held); each is held, one line each."""
    with _table(args.ids) as store:
        job_ids = _waiting_ones(store, args.ids, "can be held; nothing was held")
        actor = getattr(args, "actor", None) or user_name()
        held = [store.hold(job_id, actor) for job_id in job_ids]
    wake_supervisor(_directory())  # it withdraws their requests at once
    for record in held:
        print(f"{record.id}: held (hwpool release {record.id} lets it run)")
    return 0


def _cmd_release(args: argparse.Namespace) -> int:
    """``hwpool release ID...``: the holds on queued or waiting jobs released, one line each."""
    with _table(args.ids) as store:
        job_ids = _waiting_ones(store, args.ids, "is held or released; nothing was released")
        before = {job_id: store.get(job_id) for job_id in job_ids}
        released = [store.release_hold(job_id) for job_id in job_ids]
    start_supervisor(_directory())
    for record in released:
        print(f"{record.id}: " + ("released" if before[record.id].held else "was not held"))
    return 0


def _waiting_ones(store: JobStore, job_ids: Sequence[str], refusal: str) -> list[str]:
    """The queued or waiting jobs ``job_ids`` stand for (an array's: its members that are);
    JobStateError ending in ``refusal`` for a job named itself in another state."""
    kept = []
    for job_id, named in expanded(store, job_ids).items():
        record = store.get(job_id)
        if record.state in (JobState.QUEUED, JobState.WAITING):
            kept.append(job_id)
        elif named:
            raise JobStateError(f"{job_id} is {record.state.value}: only a queued job (or one "
                                f"waiting on a dependency) {refusal}")  # fmt: skip
    return kept


# ----------------------------------------------------------------- cancel (jN)


def _cmd_cancel(args: argparse.Namespace) -> int:
    """``hwpool cancel`` given job ids only (``_parser`` sends any other to ``_host_cmds``,
    which cancels jobs through :func:`cancel_jobs` too): 1 if one was not confirmed."""
    try:
        unfinished = cancel_jobs(list(dict.fromkeys(args.ids)))
    except CancelRefused as exc:
        print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.status
    return 1 if unfinished else 0


def _for_user(
    command: Callable[[argparse.Namespace], int], name: str
) -> Callable[[argparse.Namespace], int]:
    """``command``, and with ``--user NAME``: root runs it as NAME on NAME's own table
    (``_as_user``), recorded as root's; anyone else is refused (exit 1), changing nothing."""

    def run(args: argparse.Namespace) -> int:
        if getattr(args, "user", None) is None:
            return command(args)
        if os.geteuid() != 0:
            print(f"hwpool: error: {name} --user: only root may {name} another user's jobs (a "
                  "job table is its user's alone; the server's admins may cancel them: "
                  "hwpool cancel --user NAME)", file=sys.stderr)  # fmt: skip
            return _exits.FAILED
        try:
            user = pwd.getpwnam(args.user)
        except KeyError:
            print(f"hwpool: error: {name} --user: no user named {one_line(repr(args.user))}",
                  file=sys.stderr)  # fmt: skip
            return _exits.USAGE
        own = argparse.Namespace(**{**vars(args), "user": None, "actor": "root"})
        return run_as(user, lambda: command(own), f"{name} --user")

    return run


cmd_update = _for_user(_guarded(_cmd_update), "update")
cmd_hold = _for_user(_guarded(_cmd_hold), "hold")
cmd_release = _for_user(_guarded(_cmd_release), "release")
cmd_jobs = _guarded(_cmd_jobs)
cmd_logs = _for_user(_guarded(_cmd_logs), "logs")
cmd_wait = _guarded(_cmd_wait, broken=_exits.HWPOOL_FAILED)
cmd_retry = _guarded(_cmd_retry)
cmd_cancel = _guarded(_cmd_cancel)
