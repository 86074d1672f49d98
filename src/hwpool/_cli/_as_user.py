"""Root acting on another user's jobs as that user: a child process becomes the user (groups,
gid, then uid, for good; their home and default state directory) and runs the user's own
command there, so every check on their table is the one their own commands make, no file of
root's is left in it, and nothing runs with more rights than the user has. Shared by
``hwpool cancel --user`` and ``hold``/``release``/``update --user``."""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Callable

from .._jobs._others import default_state_directory
from ._text import one_line

__all__ = ["run_as"]


def run_as(user: pwd.struct_passwd, work: Callable[[], int], what: str) -> int:
    """Root: ``work()`` in a child that is ``user``; its exit status (1, with a line naming
    ``what``, if it raised)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child; its work is what the tests check)
        code = 1
        try:
            _become(user)
            code = work()
        except BaseException as exc:  # the child must never return into root's command
            print(f"hwpool: error: {what}: {one_line(str(exc))}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _become(user: pwd.struct_passwd) -> None:
    """Become ``user`` for good: groups, gid, then uid; their home and state directory."""
    os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
    os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
    os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
    os.environ["HOME"] = user.pw_dir
    os.environ["HWPOOL_STATE_DIR"] = str(default_state_directory(user))
