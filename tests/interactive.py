"""Children started as from an interactive shell: SIGINT and SIGHUP at their default action.

Ignored signals are inherited: under ``nohup`` (SIGHUP) or a shell's ``&`` or ``trap '' INT``
(SIGINT) every process the suite starts would ignore them too, and hwpool keeps a signal that
was ignored when it started ignored, by design (docs/run.md: ``nohup hwpool run -- CMD &``
survives the terminal). A test that delivers one of them to a child and expects the child to
act on it therefore starts that child through :data:`INTERACTIVE`, which restores the default
action and then runs the command in the same process (same pid), as a terminal's shell would
have started it. The suite itself keeps whatever it was given.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

_RESTORE = (
    "import os, signal, sys\n"
    "for signum in (signal.SIGINT, signal.SIGHUP):\n"
    "    signal.signal(signum, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)

INTERACTIVE = (sys.executable, "-c", _RESTORE)
"""A prefix that runs the command after it with SIGINT and SIGHUP at their default action."""


def interactive(argv: Sequence[str]) -> list[str]:
    """``argv`` run with SIGINT and SIGHUP at their default action (see the module doc)."""
    return [*INTERACTIVE, *argv]
