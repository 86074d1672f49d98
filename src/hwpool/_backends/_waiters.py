"""Parked requests of the local backend: one class per way of waiting, each with ``deliver()``.

The backend sets ``grant`` under its lock (None with ``closed`` set when the pool closed) and
calls ``deliver()`` after dropping it. ``deliver()`` returns False when the waiter can never be
told (its event loop is closed); the backend then hands the grant back.
"""

from __future__ import annotations

import asyncio
import threading
from asyncio.events import _get_running_loop
from collections.abc import Callable

from .._core._scheduler import Demand, Grant

__all__ = ["AsyncWaiter", "ThreadWaiter", "Waiter"]


class _Parked:
    """What every waiter carries (set by each subclass's ``__init__``, one frame per waiter).

    ``ticket`` is 0 until the core has queued it; ``since`` is when it started waiting;
    ``returned`` says its grant went back to the pool undelivered; ``closed`` that ``close()``
    woke it, with no grant. ``demand`` and ``expected`` are what it asked the core for, set
    when it is queued, so that the core can be rebuilt with it after an exception.
    """

    __slots__ = ("closed", "demand", "expected", "grant", "returned", "since", "ticket")
    closed: bool
    demand: Demand
    expected: float | None
    grant: Grant | None
    returned: bool
    since: float
    ticket: int


class ThreadWaiter(_Parked):
    """A thread blocked on its own ``threading.Event`` (only the granted thread is woken)."""

    __slots__ = ("event",)

    def __init__(self, since: float) -> None:
        self.since = since
        self.ticket = 0
        self.grant = None
        self.returned = self.closed = False
        self.event = threading.Event()

    def deliver(self) -> bool:
        """Wake the thread; always possible."""
        self.event.set()
        return True


class AsyncWaiter(_Parked):
    """A task waiting on a future of its own event loop.

    From the loop's own thread the future is resolved at once; from any other thread through
    ``call_soon_threadsafe``, with a callback that hands the grant back (``on_lost``) if the
    loop drops it unrun (``loop.close()`` discards what was scheduled).
    """

    __slots__ = ("future", "loop", "on_lost")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        since: float,
        on_lost: Callable[[AsyncWaiter], None],
    ) -> None:
        self.since = since
        self.ticket = 0
        self.grant = None
        self.returned = self.closed = False
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.on_lost = on_lost

    def deliver(self) -> bool:
        """Resolve the future on its loop; False if that loop is closed."""
        if self.loop is _get_running_loop():
            _resolve(self.future)
            return True
        delivery = _Delivery(self)
        try:
            self.loop.call_soon_threadsafe(delivery)
        except RuntimeError:  # the loop is closed: nothing will ever run there
            delivery.waiter = None
            return False
        return True


Waiter = ThreadWaiter | AsyncWaiter


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled waiter gives its grant back itself
        future.set_result(None)


class _Delivery:
    """The callback scheduled on another thread's loop: resolves the waiter's future when run.

    If the loop is closed before it runs, the loop drops it and this finalizer hands the grant
    back; ``on_lost`` must therefore never block (see LocalBackend).
    """

    __slots__ = ("waiter",)

    def __init__(self, waiter: AsyncWaiter) -> None:
        self.waiter: AsyncWaiter | None = waiter

    def __call__(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            _resolve(waiter.future)

    def __del__(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.future.done():  # told twice: once is enough
            waiter.on_lost(waiter)
