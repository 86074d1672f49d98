"""Calls numbered 1, 2, 3, ... let through in their order, whatever order they arrive in.

Ray starts the calls of an async actor in any order (on a loaded machine a call can arrive
seconds after ten later ones), but a driver's requests must reach the scheduler's FIFO queue
in the order the driver made them. The driver numbers its calls; the client waits here before
queueing each. A number that was never sent is skipped; ``patience_s`` bounds the wait for one
that should have come and did not, so nothing waits forever.
"""

from __future__ import annotations

import asyncio

__all__ = ["PATIENCE_S", "Turns"]

PATIENCE_S = 60.0
"""How long a call waits for an earlier one to arrive (Ray delivers an async actor's calls out
of order, by seconds on a loaded machine; a number never sent is skipped at once, so this
bounds only the unforeseen)."""


class Turns:
    """The turn of each numbered call, for one event loop. Each waiting call has its own
    future, woken only when its turn comes (no thundering herd)."""

    def __init__(self, patience_s: float = PATIENCE_S, first: int = 1) -> None:
        self._patience_s = patience_s
        self._next = first  # the next number to let through (earlier ones pass at once)
        self._done: set[int] = set()  # later numbers through already
        self._waiting: dict[int, asyncio.Future[None]] = {}

    @property
    def next(self) -> int:
        """The number whose turn it is."""
        return self._next

    async def wait(self, number: int) -> None:
        """Return once every number before ``number`` is through (or skipped, or overdue).
        A call cancelled while it waits lets the later ones through as if skipped."""
        try:
            if number > self._next:
                await self._turn(number)
        finally:
            self._through(number)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Python 3.11's wait_for may return as its task is cancelled: stop here anyway.
            raise asyncio.CancelledError

    async def _turn(self, number: int) -> None:
        future = self._waiting[number] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(future), self._patience_s)
        except TimeoutError:  # an earlier call is overdue: stop waiting for it
            self._next = max(self._next, number)
        finally:
            self._waiting.pop(number, None)

    async def skip(self, number: int) -> None:
        """Call ``number`` will never come: let the later ones through."""
        self._through(number)

    def _through(self, number: int) -> None:
        if number >= self._next:
            self._done.add(number)
        while self._next in self._done:
            self._done.remove(self._next)
            self._next += 1
        future = self._waiting.get(self._next)
        if future is not None and not future.done():
            future.set_result(None)
