"""Recovery of the books: a grant held before a restart taken back (:meth:`Recovery.restore`,
the host server's journal), and the whole core started over from a front's own books after
an interrupted call (:meth:`Recovery.rebuild`). Rule kept: 8 (a restored grant's usage
counts from when it was really granted); the rest is what the books, admission and the
policy keep.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from .._check import check_timeout
from ._books import check_rebuilt_ticket
from ._policy import Parts, Policy
from ._requests import Demand, Grant

__all__ = ["Recovery"]


class Recovery:
    """Restores grants and rebuilds the books and the queue (see the module docstring)."""

    def __init__(self, parts: Parts, policy: Policy) -> None:
        self.parts = parts
        self.policy = policy

    def restore(
        self,
        gpus: tuple[int, ...],
        units: int,
        now: float | None,
        owner: Hashable,
        since: float | None,
    ) -> Grant:
        """:meth:`~hwpool._core._scheduler.Scheduler.restore`."""
        books, order = self.parts.books, self.parts.order
        if order.queue:
            raise ValueError(f"cannot restore a grant while {len(order.queue)} requests wait")
        if not gpus or len(set(gpus)) != len(gpus):
            raise ValueError(f"gpus to restore must be distinct and non-empty, got {gpus!r}")
        for gpu in gpus:
            books.check_gpu(gpu)
        books.check_units(units)
        free = books.free
        for gpu in gpus:
            if free[gpu] < units:
                raise ValueError(
                    f"cannot restore {units} units on GPU {gpu}: only {free[gpu]} free"
                )
        books.check_memory_room(dict.fromkeys(gpus, units))  # rule 13
        hash(owner)  # TypeError for an owner that cannot be one, before any change
        at = books.commit(books.time(now))
        if owner is not None:
            order.count_usage()
        for gpu in gpus:
            free[gpu] -= units
        grant = Grant(next(books.tickets), tuple(gpus), units)
        parts = tuple((gpu, units) for gpu in gpus)
        self.policy.restored(grant.ticket, owner, parts, at)  # not learned from
        if since is not None and order.counting:
            order.usage.backdate(owner, dict(parts), since, at)
        return grant

    def rebuild(
        self,
        held: Iterable[tuple[int, Iterable[tuple[int, int]]]],
        waiting: Iterable[tuple[int, Demand, float | None]],
        now: float | None,
    ) -> list[Grant]:
        """:meth:`~hwpool._core._scheduler.Scheduler.rebuild`: all checked before anything
        changes, then every part starts over and takes back what the caller holds."""
        books, order, policy = self.parts.books, self.parts.order, self.policy
        clock = books.time(now)
        grants = books.checked_grants(held)
        queue = sorted(
            (
                (check_rebuilt_ticket(ticket), self.parts.admission.admit(demand),
                 check_timeout(hint, "expected"))
                for ticket, demand, hint in waiting
            ),
            key=lambda entry: entry[0],
        )  # fmt: skip
        tickets = [ticket for ticket, _ in grants] + [entry[0] for entry in queue]
        if len(set(tickets)) != len(tickets):
            raise ValueError(f"tickets must be distinct, got {sorted(tickets)}")
        books.check_taken(grants)
        at = books.commit(clock)
        books.start_over()
        order.reset()
        policy.start_over()
        books.take_withheld()
        self.parts.durations.forget_runs()
        order.usage.forget_grants(at)
        free = books.free
        for ticket, parts in grants:
            for gpu, units in parts:
                free[gpu] -= units
            # The books carry no owner: a held grant counts as owner None's from now.
            policy.restored(ticket, None, parts, at)
        for ticket, demand, hint in queue:
            order.enqueue(ticket, demand)
            policy.requeue(ticket, demand, hint)
        return policy.walk(at) if queue else []
