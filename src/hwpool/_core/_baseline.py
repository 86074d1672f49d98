"""What the simulator's baseline policies share (``fifo``, ``first-fit``): no reservations,
no head, usage counted from the start, and grants made by the one rule each baseline has.

The baselines exist to show what the hwpool policies buy (``hwpool simulate --policy``);
they are core policies like the others, over the same parts, so the simulator drives them
through the same :class:`~hwpool._core._scheduler.Scheduler`. They keep none of rules
3-7e: owners, priorities and limits are checked by admission but order nothing (plain FIFO
by ticket). Each subclass says where a waiter goes and who starts after a release.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from ._policy import Parts
from ._requests import Demand, Grant, Head, make_grant

__all__ = ["Baseline"]


class Baseline:
    """The parts of a baseline policy that do not decide; see the module docstring."""

    lazy_usage: ClassVar[bool] = False

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.books, self.order, self.placement = parts.books, parts.order, parts.placement
        self.finish = parts.order.usage.finish
        self.restored = parts.order.usage.start  # held from before: counted from now
        self.start_over()

    def start_over(self) -> None:
        """Nobody waits (a subclass forgets its own index of the waiters too)."""

    @property
    def head(self) -> Head | None:
        return None

    def reservations(self) -> dict[int, tuple[int, ...]]:
        return {}

    def reserving(self) -> Iterable[int]:
        return ()

    def place(self, demand: Demand, *, arriving: bool) -> tuple[int, ...] | None:
        """The GPUs ``demand`` would take now (None: it waits); ``arriving``: a new
        arrival, not a waiter."""
        raise NotImplementedError

    def granted(self, ticket: int, demand: Demand, gpus: tuple[int, ...]) -> Grant:
        """``demand`` taken on ``gpus`` and counted in its owner's usage."""
        self.placement.take(demand, gpus)
        grant = make_grant((ticket, gpus, self.books.units_of(demand, gpus)))
        return self.order.accounted(grant, demand.owner)

    def grant_now(self, demand: Demand, now: float, hint: float | None) -> Grant | None:
        gpus = self.place(demand, arriving=True)
        if gpus is None:
            return None
        return self.granted(next(self.books.tickets), demand, gpus)

    def would_wait(self, demand: Demand, now: float, hint: float | None) -> bool:
        return self.place(demand, arriving=True) is None

    def submit(self, demand: Demand, now: float, hint: float | None) -> tuple[int, Grant | None]:
        ticket = next(self.books.tickets)
        gpus = self.place(demand, arriving=True)
        if gpus is not None:
            return ticket, self.granted(ticket, demand, gpus)
        self.order.enqueue(ticket, demand)
        self.requeue(ticket, demand, hint)
        return ticket, None

    def requeue(self, ticket: int, demand: Demand, hint: float | None) -> None:
        """A waiter queued (``order.enqueue`` done): a subclass indexes it."""

    def unqueue(self, ticket: int) -> Demand:
        """Take a waiter out of the queue (a subclass out of its index too)."""
        return self.order.unqueue(ticket)

    def cancel(self, ticket: int, now: float) -> list[Grant]:
        self.unqueue(ticket)
        return self.walk(now)

    def walk(self, now: float) -> list[Grant]:
        raise NotImplementedError
