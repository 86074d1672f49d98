"""The exit statuses of the ``hwpool`` command: one status per meaning, named once here.

A script reads a status without the message, so no status says two things. 125, 126 and 127
mean what they mean for ``env``, ``timeout`` and shells; 124 what it means for ``timeout``;
128 + N is death by signal N, as shells report it. ``hwpool run`` and ``hwpool wait`` also
pass on a job's own status, which may be any number: their line on stderr (or per job) says
which it was. The table is in docs/cli.md ("Exit statuses").
"""

from __future__ import annotations

import signal

__all__ = [
    "CANCELLED",
    "CANNOT_RUN",
    "FAILED",
    "GAVE_UP",
    "HWPOOL_FAILED",
    "INTERRUPTED",
    "LOST",
    "NOT_FOUND",
    "NOT_MEMBER",
    "OK",
    "TIMED_OUT",
    "USAGE",
]

OK = 0
FAILED = 1
"""A command that never passes on a job's status (``status``, ``cancel``, ``jobs``, ``logs``,
``bench``) could not do its work: no server, an unusable table or log, a benchmark failed."""
USAGE = 2
"""Bad usage or input, nothing done: a malformed option, an unknown id, a request the server
could never grant, a server other than the one your supervisor serves."""
GAVE_UP = 75
"""``EX_TEMPFAIL``: the time given to wait (``--timeout``) passed first; nothing is wrong,
try again later (``hwpool run`` in the queue, ``hwpool wait`` for jobs)."""
NOT_MEMBER = 77
"""``EX_NOPERM``: the server does not serve this user (not a member of its group)."""
LOST = 123
"""``hwpool wait``: the job died while nothing watched it; how it ended is unknown."""
TIMED_OUT = 124
"""The job ran past its time limit (``--time``) and was ended, as ``timeout(1)`` says."""
HWPOOL_FAILED = 125
"""hwpool itself failed, in a command whose status may be a job's (``run``, ``submit``,
``wait``): no server answers, the server went away, an unusable job table."""
CANNOT_RUN = 126
"""The command was found but cannot be run (not an executable file)."""
NOT_FOUND = 127
"""The command was not found."""
INTERRUPTED = 128 + signal.SIGINT
"""Ctrl-C (130)."""
CANCELLED = 128 + signal.SIGTERM
"""Cancelled (143): SIGTERM, ``hwpool cancel`` of the request while it waited, or a job
cancelled before it ran (as if SIGTERM had ended it)."""
