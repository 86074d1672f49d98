"""Jobs of the CPU pool: who runs what, the row chunking, and how errors come back.

A :class:`Job` is what the pool publishes in its job slot: a share function run once by each
participant, plus the per-participant exceptions it raised. Row jobs split each row space into
chunks of ``grain`` rows and let participants pull chunk numbers from one shared cursor.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from .._check import check_int
from ._cursor import Cursor

__all__ = [
    "Job",
    "RowSpace",
    "ceil_div",
    "check_grain",
    "check_rows",
    "default_grain",
    "tail_bounds",
]

RowFunction = Callable[[int, int], object]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, exactly: float division loses rows beyond 2**53."""
    return -(-a // b)


def default_grain(rows: int, participants: int) -> int:
    """Rows per chunk: ``max(1, min(max(rows // (8 * p), 32), ceil(rows / p)))``.

    About eight chunks per participant for balance, at least 32 rows to amortise the call, and
    never so many that some participant gets none.
    """
    return max(1, min(max(rows // (8 * participants), 32), ceil_div(rows, participants)))


def check_rows(rows: object) -> int:
    """``rows`` as an int >= 0; TypeError/ValueError otherwise."""
    return check_int("rows", rows, minimum=0)


def check_grain(grain: object) -> int:
    """``grain`` as an int >= 1; TypeError/ValueError otherwise."""
    return check_int("grain", grain, minimum=1)


def tail_bounds(start: int, rows: int, participants: int, grain: int) -> tuple[int, ...]:
    """Boundaries that cut ``start..rows`` into shrinking ranges: ``ceil(rest / participants)``
    rows each, never fewer than ``grain // 8`` (nor 1), never more than ``grain``.

    The last ranges of a job decide when its slowest participant finishes; cutting them finer
    makes the participants finish together (guided self-scheduling, for the tail only).
    """
    smallest = max(1, grain // 8)
    bounds = [start]
    while bounds[-1] < rows:
        rest = rows - bounds[-1]
        bounds.append(bounds[-1] + min(rest, grain, max(smallest, ceil_div(rest, participants))))
    return tuple(bounds)


@dataclass(frozen=True, slots=True)
class RowSpace:
    """Rows ``0..rows`` handed to ``f``: ``body`` chunks of ``grain`` rows, then the ``tail``.

    ``tail`` holds the boundaries of the last, shrinking ranges (empty: none, every chunk is of
    ``grain`` rows but the last). :meth:`tailed` builds the default split.
    """

    rows: int
    f: RowFunction
    grain: int
    tail: tuple[int, ...] = ()
    body: int = field(init=False)
    chunks: int = field(init=False)

    def __post_init__(self) -> None:
        if self.tail:
            body = (self.tail[0]) // self.grain
            chunks = body + len(self.tail) - 1
        else:
            body = chunks = ceil_div(self.rows, self.grain)
        object.__setattr__(self, "body", body)
        object.__setattr__(self, "chunks", chunks)

    @classmethod
    def tailed(cls, rows: int, f: RowFunction, participants: int) -> RowSpace:
        """The default split: :func:`default_grain` chunks, the last ``participants`` of them
        cut finer (:func:`tail_bounds`), so that the participants finish together."""
        grain = default_grain(rows, participants)
        body = max(0, ceil_div(rows, grain) - participants)
        return cls(rows, f, grain, tail_bounds(body * grain, rows, participants, grain))


class Job:
    """One dispatch: ``share(job, index)`` runs once per participant; errors are collected.

    ``helpers`` (``n_participants - 1``) workers run it besides the caller; ``woken`` counts the
    ones the dispatcher has woken so far.
    """

    __slots__ = ("epoch", "errors", "failed", "helpers", "n_participants", "share", "woken")

    def __init__(self, epoch: int, share: Callable[[Job, int], object], n_participants: int):
        self.epoch = epoch
        self.share = share
        self.n_participants = n_participants
        self.helpers = n_participants - 1
        self.woken = 0
        self.errors: list[tuple[int, BaseException]] = []
        self.failed = False

    @classmethod
    def rows(cls, epoch: int, spaces: Sequence[RowSpace], n_participants: int) -> Job:
        """A job whose participants pull chunks of ``spaces`` until none are left."""
        starts = [0, *accumulate(space.chunks for space in spaces)]
        total = starts.pop()
        cursor = Cursor()

        def share(job: Job, index: int) -> None:
            claim = cursor.next
            while not job.failed:
                chunk = claim()
                if chunk >= total:
                    return
                at = bisect_right(starts, chunk) - 1
                space = spaces[at]
                local = chunk - starts[at]
                if local < space.body:
                    low = local * space.grain
                    space.f(low, min(low + space.grain, space.rows))
                else:
                    tail = space.tail
                    local -= space.body
                    space.f(tail[local], tail[local + 1])

        return cls(epoch, share, n_participants)

    def run_share(self, index: int) -> None:
        """Run participant ``index``'s share, recording instead of raising its exception."""
        try:
            self.share(self, index)
        except BaseException as exc:
            self.failed = True
            self.errors.append((index, exc))

    def raise_errors(self) -> None:
        """Re-raise the collected errors: one as itself, several as a BaseExceptionGroup."""
        if not self.errors:
            return
        errors = sorted(self.errors, key=lambda item: item[0])
        for index, exc in errors:
            exc.add_note(f"raised in CPUPool participant {index} of {self.n_participants}")
        if len(errors) == 1:
            raise errors[0][1]
        excs = [exc for _, exc in errors]
        raise BaseExceptionGroup(f"{len(excs)} CPUPool participants raised", excs)
