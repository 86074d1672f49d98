"""``hwpool cancel --user NAME jN...``: cancel another user's jobs, for root or an admin.

A job lives in its user's own table (``~NAME/.local/state/hwpool``, theirs alone), so:

- **root** cancels them as NAME would: a child process becomes NAME (uid, gid, groups,
  home) and runs NAME's own ``hwpool cancel jN`` on NAME's default state directory. The
  table is written only by its owner (no file of root's is left there), every check on it
  is the one NAME's commands make, and nothing runs with more rights than NAME has. Every
  state is covered: a queued or waiting job is recorded cancelled (``cancelled by root``),
  a running one ended by its launcher.
- **anyone else** goes through the host server, the one that knows who is an admin:
  NAME's requests and leases labelled ``jN ...`` (the supervisor's and the launchers' labels)
  are cancelled there, which the server allows an admin only (``forbidden`` otherwise,
  and a non-admin does not even see other users' labels). A withdrawn request cancels its
  job, a revoked lease ends the running job; their user's supervisor and launcher record it.

A refusal (not root nor an admin, an unknown user or job) is exit 2 and changes nothing.
"""

from __future__ import annotations

import argparse
import os
import pwd
import re
import sys

from .._jobs._others import read_user_jobs
from .._wire._connection import Wire
from .._wire._protocol import LeaseRecord, WaiterRecord
from ._as_user import run_as
from ._host_access import cancel_one, socket_of
from ._text import one_line

__all__ = ["cmd_cancel_user"]


def cmd_cancel_user(args: argparse.Namespace) -> int:
    """``hwpool cancel --user NAME [jN...] [--state S]`` (see the module): 0 when each was
    cancelled. With no ids: every job of NAME's that is not finished (``--state``: those in
    these states), as Slurm's ``scancel -u NAME``."""
    job_ids = list(dict.fromkeys(args.ids))
    problem = _usage(args, job_ids)
    if problem is not None:
        print(f"hwpool: error: cancel --user: {problem}", file=sys.stderr)
        return 2
    try:
        user = pwd.getpwnam(args.user)
    except KeyError:
        print(f"hwpool: error: cancel --user: no user named {one_line(repr(args.user))}",
              file=sys.stderr)  # fmt: skip
        return 2
    states = args.state if args.state is not None else _UNFINISHED
    if os.geteuid() == 0:
        if not job_ids:
            job_ids = _unfinished(user, states)
            if not job_ids:
                print(f"{user.pw_name} has no job to cancel ({', '.join(sorted(states))})")
                return 0
        return _as_user(user, job_ids)
    return _at_server(args, user, job_ids, states)


_UNFINISHED = frozenset({"queued", "waiting-on-dependency", "held", "running"})


def _usage(args: argparse.Namespace, job_ids: list[object]) -> str | None:
    if not all(isinstance(i, str) for i in job_ids) or args.name is not None or args.mine:
        return "takes job ids only (j12); cancel a server request by its id, without --user"
    if job_ids and args.state is not None:
        return "--state selects NAME's jobs to cancel when no id is given: give one or the other"
    if args.state is not None and not args.state <= _UNFINISHED:
        finished = ", ".join(sorted(args.state - _UNFINISHED))
        return f"--state: only jobs that have not finished can be cancelled, got {finished}"
    return None


def _unfinished(user: pwd.struct_passwd, states: frozenset[str]) -> list[str]:
    """Root: the ids of ``user``'s jobs in ``states``, oldest first (read-only)."""
    jobs = read_user_jobs(user, include_finished=False)
    return [job.id for job in reversed(jobs) if job.shown_state in states]


def _as_user(user: pwd.struct_passwd, job_ids: list[str]) -> int:
    """Root: cancel ``job_ids`` in ``user``'s default table in a child that is ``user``."""
    return run_as(user, lambda: _cancel_as(user, job_ids), "cancel --user")


def _cancel_as(user: pwd.struct_passwd, job_ids: list[str]) -> int:
    """As ``user`` (see ``_as_user``): cancel as their own command would."""
    from ._job_table import CancelRefused, cancel_jobs  # noqa: PLC0415 (after the change)

    try:
        unconfirmed = cancel_jobs(job_ids, reason="cancelled by root", by="root")
    except CancelRefused as exc:
        print(f"hwpool: error: {user.pw_name}'s {one_line(str(exc))}", file=sys.stderr)
        return exc.status
    return 1 if unconfirmed else 0


def _at_server(
    args: argparse.Namespace,
    user: pwd.struct_passwd,
    job_ids: list[str],
    states: frozenset[str] = _UNFINISHED,
) -> int:
    """Anyone but root: cancel ``user``'s requests and leases labelled with the job ids at
    the host server, which refuses unless the caller is an admin; with no ids, every one of
    ``user``'s labelled with a job id (a waiter is a queued job, a lease a running one; a job
    waiting on a dependency has none there)."""
    wire = Wire(socket_of(args), role="control")
    try:
        reply = wire.status()
        records: list[LeaseRecord | WaiterRecord] = [*reply.leases, *reply.waiting]
        if not job_ids:
            kinds = (LeaseRecord,) * ("running" in states) + (WaiterRecord,) * ("queued" in states)
            job_ids = list(dict.fromkeys(
                _job_of(r) for r in records
                if r.uid == user.pw_uid and _job_of(r) and isinstance(r, kinds)
            ))  # fmt: skip
            if not job_ids:
                print(f"{user.pw_name} has no job to cancel at the server that you may see")
                return 0
        refused, req = 0, 0
        for job_id in job_ids:
            found = [r for r in records if r.uid == user.pw_uid and _labelled(r, job_id)]
            if not found:
                print(f"hwpool: error: {user.pw_name}'s {job_id}: no request or lease of it at "
                      "the hwpool server that you may see (only an admin sees other users' "
                      "jobs; a job waiting on a dependency has none)", file=sys.stderr)  # fmt: skip
                refused += 1
            for record in found:
                req += 1
                line, ok = cancel_one(wire, req, record.id, record)
                print(f"{user.pw_name}'s {job_id}: {line}" if ok else f"hwpool: error: {line}",
                      file=sys.stdout if ok else sys.stderr)  # fmt: skip
                refused += not ok
    finally:
        wire.shutdown()
    return 2 if refused else 0


def _labelled(record: LeaseRecord | WaiterRecord, job_id: str) -> bool:
    """Whether ``record`` is job ``job_id``'s (labelled ``jN NAME`` by the supervisor and
    the launcher)."""
    return _job_of(record) == job_id


def _job_of(record: LeaseRecord | WaiterRecord) -> str:
    """The job id ``record`` is labelled with (``j12``, ``j12_3``), or ``""``."""
    first = (record.name or "").split(" ", 1)[0]
    return first if _JOB_LABEL.fullmatch(first) else ""


_JOB_LABEL = re.compile(r"j[1-9][0-9]*(?:_[0-9]+)?")
