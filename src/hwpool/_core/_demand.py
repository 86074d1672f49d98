"""Requests become demands: the one path from what a caller asks to the core's :class:`Demand`.

A request names a share of one GPU (``fraction``, a number in (0, 1], or ``units``, that
share in the pool's units), a count of whole GPUs (``count``), or an amount of one GPU's
memory (``memory``, MiB or a text such as ``"6GiB"``); and an owner, a priority and a time
limit. Every front (the in-process pool, the host server and its client, the simulator, Ray)
turns its requests into demands with :func:`make_demand`, so that a request means the same
wherever it is made, and bad input gets the same errors, naming the argument and the value.

What a share or a whole GPU becomes depends on the GPUs (``totals``):

- a pool of fractions (``totals`` None): ``count`` GPUs of ``units`` each, in the pool's
  ``units_per_gpu`` (``UNITS_PER_GPU`` unless the caller's core counts otherwise);
- a pool sized in memory (``totals``: each GPU's MiB): memory is that many MiB on one GPU;
  whole GPUs are completely free ones of any size (``whole=True``); a share below 1 is that
  share of whichever GPU it lands on (``relative=True``). On GPUs of one size the core takes
  those as the one amount they are there (the whole total; the share of it, rounded up), and
  so does this unless ``keep_shares`` is set: a server keeps the marks to report a request
  as it was asked.

:class:`Demands` memoises a pool's demands per float fraction and memory amount: the
in-process pool's hot path looks a fraction up there and builds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from .._check import check_int, check_real
from ._capacity import UNITS_PER_GPU, fraction_to_units
from ._memory import format_mib, parse_memory
from ._scheduler import Demand

__all__ = ["Demands", "make_demand", "share_on", "with_terms"]

_MEMO_SIZE = 4096
"""Entries each memo of :class:`Demands` keeps at most (a program asks for a few sizes)."""


def make_demand(
    *,
    fraction: object = None,
    units: object = None,
    count: object = 1,
    memory: object = None,
    totals: Sequence[int] | None = None,
    num_gpus: int | None = None,
    units_per_gpu: int = UNITS_PER_GPU,
    owner: Hashable = None,
    priority: object = 0,
    limit: object = None,
    keep_shares: bool = False,
) -> Demand:
    """The core's demand for ``count`` GPUs with ``fraction`` (or ``units``) of each (none
    given: whole GPUs), or for ``memory`` on one GPU, of ``owner`` at ``priority`` with the
    time limit ``limit`` (seconds; None: none). See the module doc for ``totals`` (each GPU's
    MiB; None: a pool of fractions of ``num_gpus`` GPUs of ``units_per_gpu`` units) and
    ``keep_shares``.

    TypeError for both a share and memory, or a wrong type; ValueError, naming the argument
    and its value, for a share outside (0, 1], a count outside 1..the number of GPUs, several
    GPUs of less than a whole one each, memory on a pool of fractions or more than the
    largest GPU, or a bad owner, priority or limit (see :func:`with_terms`).
    """
    if memory is not None and (fraction is not None or units is not None):
        asked = f"fraction={fraction!r}" if fraction is not None else f"units={units!r}"
        raise TypeError(f"give fraction or memory, not both ({asked}, memory={memory!r})")
    if fraction is not None and units is not None:
        raise TypeError(
            f"give fraction or units, not both (fraction={fraction!r}, units={units!r})"
        )
    gpus = len(totals) if totals is not None else num_gpus
    number = check_int("count", count, minimum=1, maximum=gpus, maximum_name="num_gpus")
    full = units_per_gpu if totals is None else UNITS_PER_GPU
    if units is not None:
        share = check_int("units", units, minimum=1, maximum=full)
    elif fraction is not None:
        share = fraction_to_units(fraction) if full == UNITS_PER_GPU else _scaled(fraction, full)
    else:
        share = full
    if number > 1 and (share != full or memory is not None):
        what = f"memory={memory!r}" if memory is not None else _share_text(fraction, units)
        raise ValueError(
            f"count={number} with {what}: several GPUs are granted whole (a share or an "
            "amount of memory is of one GPU)"
        )
    if memory is not None:
        demand = Demand(1, _memory_on(totals, memory))
    elif totals is None:
        demand = Demand(number, share)
    elif share == full:
        uniform = min(totals) == max(totals)
        if uniform and not keep_shares:
            demand = Demand(number, totals[0])
        else:
            demand = Demand(number, max(totals), whole=True)
    elif keep_shares or min(totals) != max(totals):
        demand = Demand(1, share, relative=True)
    else:
        demand = Demand(1, share_on(totals[0], share))
    return with_terms(demand, owner, priority, limit)


def with_terms(demand: Demand, owner: Hashable, priority: object, limit: object) -> Demand:
    """``demand`` (one without terms yet) of ``owner`` (any hashable; None: the default
    owner) at ``priority`` (an int, higher first within its owner) with the time limit
    ``limit`` (seconds, finite and > 0; None: none); ``demand`` itself where all three are
    the defaults. TypeError or ValueError naming the argument and its value."""
    if owner is None and priority.__class__ is int and not priority and limit is None:
        return demand
    if owner is not None:
        try:
            hash(owner)
        except TypeError:
            raise TypeError(
                f"owner must be hashable, got {owner!r} ({type(owner).__name__})"
            ) from None
    rank = priority if priority.__class__ is int else check_int("priority", priority)
    if limit is None:
        seconds = None
    elif limit.__class__ is float and 0.0 < limit < math.inf:
        seconds = limit
    else:
        seconds = check_real("limit_s", limit)
        if not 0.0 < seconds < math.inf:
            raise ValueError(f"limit_s must be a finite number of seconds > 0, got {limit!r}")
    d = demand  # a new Demand directly: dataclasses.replace costs more than a grant
    return Demand(d.count, d.units, d.whole, d.relative, owner, rank, seconds)


def share_on(total: int, share: int) -> int:
    """The MiB a ``share`` (in ``UNITS_PER_GPU`` units) of a GPU of ``total`` MiB takes,
    rounded up as the core rounds a relative demand (at least 1)."""
    return max(1, -(-share * total // UNITS_PER_GPU))


def _scaled(fraction: object, full: int) -> int:
    """``fraction`` of a GPU of ``full`` units (a core that counts other units), rounded up."""
    share = fraction_to_units(fraction)
    return max(1, -(-share * full // UNITS_PER_GPU))


def _share_text(fraction: object, units: object) -> str:
    return f"fraction={fraction!r}" if fraction is not None else f"units={units!r}"


def _memory_on(totals: Sequence[int] | None, memory: object) -> int:
    """``memory`` in MiB, checked against the pool's GPUs."""
    if totals is None:
        raise ValueError(
            f"memory={memory!r}: this pool shares fractions of a GPU; a pool sized in "
            "memory is GPUPool(memory=True) or GPUPool(gpu_memory=[...])"
        )
    mib = parse_memory(memory, "memory")
    largest = max(totals)
    if mib > largest:
        raise ValueError(
            f"memory={memory!r} ({mib} MiB) is more than the largest GPU of this pool "
            f"({_in_mib(largest)}): it could never be granted"
        )
    return mib


def _in_mib(mib: int) -> str:
    """``80GiB, 81920 MiB`` where a larger unit writes ``mib`` exactly, else ``81559 MiB``
    alone (not the same number twice)."""
    short = format_mib(mib)
    return f"{mib} MiB" if short.endswith("MiB") else f"{short}, {mib} MiB"


class Demands:
    """A pool's requests as demands (:func:`make_demand`), memoised per float fraction and
    memory amount (floats never change, so equal floats are one request; other types, such
    as ``Fraction`` or NumPy numbers, are checked on every call).

    ``totals``: each GPU's MiB on a pool sized in memory, None on a pool of fractions of
    ``num_gpus`` GPUs. ``single_whole``: at most one whole GPU per request (MIG instances:
    a CUDA process can use one only). ``fractions`` is the memo of float fractions, which a
    pool's hot paths read directly.
    """

    __slots__ = ("_amounts", "_mib_on", "_num_gpus", "_single_whole", "_totals", "fractions")

    def __init__(
        self, totals: tuple[int, ...] | None, num_gpus: int, *, single_whole: bool = False
    ) -> None:
        self._totals = totals
        self._num_gpus = num_gpus
        self._single_whole = single_whole
        self.fractions: dict[float, Demand] = {}  # float fraction -> its one-GPU demand
        self._amounts: dict[int | str, Demand] = {}  # memory amount -> its demand
        self._mib_on: dict[tuple[int, float], int] = {}  # (gpu, fraction) -> MiB there

    def one(self, fraction: object, memory: object) -> Demand:
        """The one-GPU demand for ``fraction`` (default 1) or ``memory``."""
        if fraction is None and memory is None:
            fraction = 1.0  # the default: one whole GPU, memoised as 1.0
        if memory is None and fraction.__class__ is float:
            demand = self.fractions.get(fraction)
            if demand is None:
                demand = self._make(fraction, None)
                if len(self.fractions) < _MEMO_SIZE:
                    self.fractions[fraction] = demand
            return demand
        if fraction is None and memory.__class__ in _AMOUNT_TYPES and self._totals is not None:
            demand = self._amounts.get(memory)
            if demand is None:
                demand = self._make(None, memory)
                if len(self._amounts) < _MEMO_SIZE:
                    self._amounts[memory] = demand
            return demand
        return self._make(fraction, memory)

    def _make(self, fraction: object, memory: object) -> Demand:
        return make_demand(
            fraction=fraction, memory=memory, totals=self._totals, num_gpus=self._num_gpus
        )

    def whole(self, count: object) -> Demand:
        """``count`` completely free GPUs (1..num_gpus; 1 where ``single_whole``)."""
        number = check_int(
            "count", count, minimum=1, maximum=self._num_gpus, maximum_name="num_gpus"
        )
        if number > 1 and self._single_whole:
            raise ValueError(
                f"count={number}: this pool's GPUs include MIG instances, and a CUDA process "
                "can use only one MIG instance; ask for one GPU at a time"
            )
        return make_demand(count=number, totals=self._totals, num_gpus=self._num_gpus)

    def units(self, gpu: int, fraction: object, memory: object) -> int:
        """The units a release of ``fraction`` or ``memory`` on ``gpu`` gives back: a pool of
        fractions' share units, or MiB on a pool sized in memory, where a fraction is that
        share of ``gpu``'s total."""
        totals = self._totals
        if totals is None or memory is not None:
            return self.one(fraction, memory).units
        if fraction is None:
            fraction = 1.0  # the whole of this GPU, whatever its size
        if fraction.__class__ is float:
            mib = self._mib_on.get((gpu, fraction))
            if mib is None:
                mib = share_on(totals[gpu], fraction_to_units(fraction))
                if len(self._mib_on) < _MEMO_SIZE:
                    self._mib_on[gpu, fraction] = mib
            return mib
        return share_on(totals[gpu], fraction_to_units(fraction))


_AMOUNT_TYPES = (int, str)  # memory amounts memoised (exactly these types: not bool)
