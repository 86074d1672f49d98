"""What the core's parts pass between them: a request's :class:`Demand`, its :class:`Grant`,
a :class:`Waiter` as the queries show it, and the ``easy`` :class:`Head` (rules 1, 3e).

Plain immutable values, no rules: every part and every front imports them from here (the
face, :mod:`~hwpool._core._scheduler`, re-exports them).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import NamedTuple

from ._capacity import UNITS_PER_GPU
from ._limits import LimitHold

__all__ = ["UNSEEN", "Demand", "Grant", "Head", "Waiter", "class_of", "make_grant", "share"]


@dataclass(frozen=True, slots=True)
class Demand:
    """What one request needs: ``count`` GPUs with ``units`` free on each.

    ``count > 1`` always means whole GPUs; ``whole=True`` asks for one (or ``count``) whole
    GPUs of any size, where ``units`` is not used for fitting. ``relative=True`` (with
    ``count == 1``) makes ``units`` a share of one GPU in ``UNITS_PER_GPU`` units, whatever
    its size: on GPUs of different sizes its need differs per GPU (rule 1). ``owner`` (any
    hashable; default None, one owner for all) and ``priority`` (an int, higher first; default
    0) place it in the queue (rules 8-10); they never change where it fits. ``limit``
    (seconds, finite and > 0; default None) is a hold time the caller *enforces*: it ends the
    work or takes the grant back once it has held that long, so the core may count on it
    (rules 4e and 6e); a demand without one is trusted to end by no time at all.
    """

    count: int
    units: int
    whole: bool = False
    relative: bool = False
    owner: Hashable = None
    priority: int = 0
    limit: float | None = None


class Grant(NamedTuple):
    """A request that has been granted: ``units`` taken on each GPU of ``gpus``.

    A whole-GPU grant holds each GPU's total; where those differ, ``units`` is 0 and
    :meth:`Scheduler.held` gives what each GPU holds. A relative demand's grant holds the
    units it took on its one GPU.
    """

    ticket: int
    gpus: tuple[int, ...]
    units: int


UNSEEN = Demand(0, 0)
"""No demand a caller passes (the scheduler's remembered demand before the first)."""

make_grant = functools.partial(tuple.__new__, Grant)
"""``make_grant((ticket, gpus, units))``: a Grant without the Python frame of
NamedTuple.__new__ (the hot path)."""


class Head(NamedTuple):
    """The head of the queue under ``easy``: the GPUs it reserves and its shadow, the time
    (on the caller's clock) it is expected to fit there; ``since``: when it became head;
    ``moved``: whether it has used its one move (rule 3e)."""

    ticket: int
    gpus: tuple[int, ...]
    shadow: float
    since: float
    moved: bool = False


class Waiter(NamedTuple):
    """A waiting request as the core sees it: its ticket, demand and current reservation,
    and ``held``: why its owner's limit holds it (rule 11), or None."""

    ticket: int
    demand: Demand
    reserved: tuple[int, ...]
    held: LimitHold | None = None


def class_of(demand: Demand) -> tuple[int, int, bool] | tuple[int, int, bool, bool]:
    """The key hold times are learned under: a tuple hashes faster than a Demand. A relative
    demand's key is longer, so it never shares a class with an absolute demand of its units."""
    if demand.relative:
        return (demand.count, demand.units, demand.whole, True)
    return (demand.count, demand.units, demand.whole)


def share(units: int, total: int) -> int:
    """Units that ``units`` out of ``UNITS_PER_GPU`` are of a GPU of ``total``, rounded up
    (at least one): exact integer arithmetic."""
    return max(1, -(-units * total // UNITS_PER_GPU))
