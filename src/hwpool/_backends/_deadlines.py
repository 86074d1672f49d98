"""The in-process pool's time limits: a thread that calls back when a grant's limit runs out.

A grant with an enforced limit (``Demand.limit``) is armed here with its deadline, read on the
backend's clock; once the clock reaches it, ``due(ticket)`` runs on this thread (the backend
then revokes the grant if it is still held). The thread runs only while something is armed,
so an idle pool holds no thread, and the core never sees a timer: it is told only the
release. A deadline is never disarmed one by one (a release would pay for it): ``due`` of a
grant released already does nothing, and the entries of released grants are dropped in bulk
when they outnumber the live ones.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Callable

__all__ = ["Deadlines"]

MAX_SLEEP_S = 1.0
"""The longest the thread sleeps before it reads the clock again: a clock that is not the
wall clock's (a test's) may move without telling, and ``poke()`` is then the quick way."""


class Deadlines:
    """Call ``due(ticket)`` on a thread of its own once ``clock()`` reaches the ticket's
    deadline; ``live(ticket)`` says whether an armed ticket still counts (for compaction)."""

    def __init__(
        self,
        clock: Callable[[], float],
        due: Callable[[int], None],
        live: Callable[[int], bool],
    ) -> None:
        self._clock = clock
        self._due = due
        self._live = live
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int]] = []
        self._running = False
        self._waiting_for = math.inf  # the deadline the thread sleeps until (inf: none)
        self._compact_at = 64  # compact the heap once it is this long (amortised O(log n))

    def arm(self, ticket: int, deadline: float) -> None:
        """Call ``due(ticket)`` once the clock reaches ``deadline``."""
        with self._cond:
            heap = self._heap
            if len(heap) >= self._compact_at:
                heap[:] = [entry for entry in heap if self._live(entry[1])]
                heapq.heapify(heap)
                self._compact_at = 2 * len(heap) + 64
            heapq.heappush(heap, (deadline, ticket))
            if deadline < self._waiting_for:
                self._cond.notify()  # it sleeps until a later deadline: wake it
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="hwpool-limits", daemon=True).start()

    def run_due(self) -> None:
        """Call ``due`` now, on the calling thread, for every ticket whose deadline the clock
        has reached (for a clock that moves by other means than time: a test's)."""
        now = self._clock()
        with self._cond:
            heap, tickets = self._heap, []
            while heap and heap[0][0] <= now:
                tickets.append(heapq.heappop(heap)[1])
        for ticket in tickets:
            if self._live(ticket):
                self._due(ticket)

    def armed(self) -> int:
        """How many deadlines are armed (released grants' among them until dropped)."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        """Sleep until the earliest deadline, call its ``due``, and so on; end when none is
        left (``arm`` starts a new thread then)."""
        while True:
            with self._cond:
                while True:
                    if not self._heap:
                        self._running = False
                        self._waiting_for = math.inf
                        return
                    deadline, ticket = self._heap[0]
                    delay = deadline - self._clock()
                    if delay <= 0:
                        heapq.heappop(self._heap)
                        break
                    self._waiting_for = deadline
                    self._cond.wait(min(delay, MAX_SLEEP_S))
                    self._waiting_for = math.inf
            if self._live(ticket):
                try:
                    self._due(ticket)  # without the condition: it takes the backend's lock
                except BaseException:
                    with self._cond:
                        self._running = False  # the next arm starts a thread again
                    raise
