"""The supervisor's pause while the job table cannot be written (the disk is full, an I/O
error, a lock held past the busy timeout: any ``sqlite3.Error``).

A fault is never the supervisor's end: it stops looking at the table (and so asks for no
share and starts no launcher), says why once per reason (a log on a full disk cannot take a
line a second), and looks again after 1 s, doubling to a minute while the faults go on; the
first look that goes through ends the pause, and the supervisor resumes by itself. A fault
more than :data:`FORGET_S` after the last one starts again at 1 s.

A launcher that cannot write the table exits with :data:`TABLE_FAULT`: before its job
started, the job stays queued and the supervisor pauses as for a fault of its own (a
launcher per second while the disk is full would help nobody); after, the launcher gave up
recording the job's end, which the supervisor records as ``lost``, saying so.
"""

from __future__ import annotations

__all__ = ["TABLE_FAULT", "TableFaults"]

TABLE_FAULT = 4  # a launcher's exit status: the job table could not be written
FIRST_S = 1.0
CAP_S = 60.0
FORGET_S = 2 * CAP_S


class TableFaults:
    """When to look at the table again after a fault, and whether a fault is news."""

    def __init__(self) -> None:
        self._delay = 0.0
        self._until = 0.0  # no look before this (time.monotonic())
        self._last = -FORGET_S  # when the last fault was
        self._reason: str | None = None  # the pause's reason; None: not paused

    @property
    def paused(self) -> bool:
        """Whether the last look at the table failed (and none went through since)."""
        return self._reason is not None

    def failed(self, reason: str, now: float) -> bool:
        """Note a fault at ``now`` (``time.monotonic()``); whether to log it (a new reason)."""
        fresh = now - self._last > FORGET_S
        self._delay = FIRST_S if fresh else min(max(self._delay, FIRST_S) * 2, CAP_S)
        self._until, self._last = now + self._delay, now
        new = reason != self._reason
        self._reason = reason
        return new

    def wait_s(self, now: float) -> float:
        """How long before the table may be looked at again (0: now)."""
        return max(self._until - now, 0.0)

    def healed(self) -> bool:
        """A look at the table went through: end the pause; whether there was one."""
        was, self._reason = self._reason is not None, None
        return was
