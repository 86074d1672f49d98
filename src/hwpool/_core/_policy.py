"""What a scheduling policy is: the interface each policy module implements, the parts it is
given, and the table of policies by name.

A policy decides who is granted and what is reserved, and nothing else: it is handed the
core's parts (:class:`Parts`) when the face is built and plans over them. The books hold the
capacity, the queue order says who comes first, admission has already checked every demand
it sees, placement finds best fit, and the owner holds say whom a limit holds. The face
(:class:`~hwpool._core._scheduler.Scheduler`) checks the arguments, keeps the clock, and
calls the policy; it has no branch per policy. A new policy is a new module with a class
that implements :class:`Policy`, named in :data:`POLICY_MODULES` (and its name in
:data:`~hwpool._core._policies.POLICIES`, where the command line and the config read it,
or in :data:`~hwpool._core._policies.BASELINES` for the simulator's comparisons alone).

Every method returns the grants it made; the face hands them to the front, which wakes the
waiters. A method may change the books and the queue only through the parts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import ClassVar, Protocol

from ._admission import Admission
from ._books import Books
from ._durations import Durations
from ._holds import OwnerHolds
from ._order import QueueOrder
from ._placement import Placement
from ._requests import Demand, Grant, Head

__all__ = ["POLICY_MODULES", "Parts", "Policy", "policy_class"]


@dataclass(frozen=True, slots=True)
class Parts:
    """The core's parts, as a policy is given them. ``estimates``: ``backfill="estimates"``
    (rule 4e); ``fast``: GPUs of one size, no limits, no groups and no memory groups, where
    a policy may take a faster path to the same decisions."""

    books: Books
    order: QueueOrder
    holds: OwnerHolds
    admission: Admission
    placement: Placement
    durations: Durations
    estimates: bool
    fast: bool


class Policy(Protocol):
    """A scheduling policy over the core's parts. Times are the face's clock, already
    committed; demands are admitted; tickets are the books' own."""

    lazy_usage: ClassVar[bool]
    """Whether usage may go uncounted until a demand names an owner or a priority (rule 8)."""

    def __init__(self, parts: Parts) -> None:
        """Plan over ``parts`` from now on (nobody waits yet)."""

    @property
    def finish(self) -> Callable[[int | None, int, int, float], None]:
        """Record that ``units`` on ``gpu`` of grant ``ticket`` (None: unknown) ended at
        ``now``, after the face gave them back to the books: usage, and what the policy
        learns (a bound method of the parts, called directly on the hot path)."""

    @property
    def head(self) -> Head | None:
        """The waiter that alone reserves, with its shadow, or None where none does."""

    def start_over(self) -> None:
        """Nobody waits: forget every waiter and reservation (the books start over too)."""

    def reservations(self) -> dict[int, tuple[int, ...]]:
        """The GPUs each reserving waiter reserves (a new dict)."""

    def reserving(self) -> Iterable[int]:
        """The tickets of the waiters that reserve now (they keep room under limits)."""

    def grant_now(self, demand: Demand, now: float, hint: float | None) -> Grant | None:
        """Grant ``demand`` where a new arrival may be granted at once, or return None; it
        never waits."""

    def submit(self, demand: Demand, now: float, hint: float | None) -> tuple[int, Grant | None]:
        """Grant ``demand`` at once, or queue it (``order.enqueue``); its ticket and grant."""

    def would_wait(self, demand: Demand, now: float, hint: float | None) -> bool:
        """Whether :meth:`submit` would queue ``demand``, changing nothing."""

    def restored(
        self, ticket: int, owner: Hashable, parts: tuple[tuple[int, int], ...], now: float
    ) -> None:
        """Count a grant held from before (taken from the books already): nothing is learned
        from its start."""

    def requeue(self, ticket: int, demand: Demand, hint: float | None) -> None:
        """A waiter put back in the queue by a rebuild (``order.enqueue`` done)."""

    def cancel(self, ticket: int, now: float) -> list[Grant]:
        """Withdraw waiter ``ticket``; the grants that follows."""

    def walk(self, now: float) -> list[Grant]:
        """Grant what now fits and reserve afresh, after capacity came back (a release, a
        cancel, less withheld, a rebuild); only called while some wait."""


POLICY_MODULES = {
    "easy": "._easy",
    "reserve-all": "._reserve_all",
    "fifo": "._fifo",
    "first-fit": "._first_fit",
}
"""Each policy's module (relative to this package); it holds the class named ``POLICY``."""


def policy_class(name: str) -> type[Policy]:
    """The class of the policy called ``name`` (one of :data:`POLICY_MODULES`)."""
    module = importlib.import_module(POLICY_MODULES[name], __package__)
    made: type[Policy] = module.POLICY
    return made
