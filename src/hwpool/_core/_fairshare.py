"""Owners' recent usage and shares, and each owner's waiting queue (fair share, rules 8-10).

Pure, like the rest of the core: time comes in as ``now`` from the caller's clock.

An owner's *usage* is the GPU-seconds of its grants, finished and running, decayed
exponentially with a half-life: at time ``t`` it is the integral over the past of the GPUs
it held at ``s``, weighted ``2 ** -((t - s) / half_life)``. A grant of ``u`` units on a GPU of
``total`` units counts ``u / total`` GPUs. This is the usage of Slurm's classic fair-share
factor (priority/multifactor: ``PriorityDecayHalfLife``, ``F = 2 ** (-usage / shares)``
with usage and shares normalised; ranking owners by ``usage / share`` is the same order).
It is kept in O(1) per change: per owner the decayed usage at a reference time and the GPUs
held since (a constant rate), so between changes usage(t) is
``u0 * d + rate * (1 - d) / k`` with ``k = ln 2 / half_life`` and ``d = exp(-k (t - t0))``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence

from .._check import check_real

_expm1 = math.expm1  # exp(x) - 1, exact near 0: usage over spans far below the half-life

__all__ = [
    "DEFAULT_HALF_LIFE",
    "Account",
    "OwnerQueue",
    "Usage",
    "check_half_life",
    "check_shares",
]

DEFAULT_HALF_LIFE = 3600.0
"""Seconds (of the caller's clock) after which a GPU-second of usage counts half: an hour,
so that yesterday's heavy user is not held back today, while a flood of short jobs within
the hour still counts in full."""


def check_shares(shares: object) -> dict[Hashable, float]:
    """``shares`` as a dict owner -> positive finite share; TypeError/ValueError naming the
    argument, the owner and the value otherwise."""
    if shares is None:
        return {}
    if not isinstance(shares, Mapping):
        raise TypeError(
            f"shares must be a mapping of owner to share, got {shares!r} ({type(shares).__name__})"
        )
    checked: dict[Hashable, float] = {}
    for owner, share in shares.items():
        number = check_real(f"shares[{owner!r}]", share)
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"shares[{owner!r}] must be a finite number > 0, got {share!r}")
        checked[owner] = number
    return checked


def check_half_life(half_life: object) -> float:
    """``half_life`` in seconds as a finite float > 0, else TypeError/ValueError naming it."""
    number = check_real("half_life", half_life)
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"half_life must be a finite number of seconds > 0, got {half_life!r}")
    return number


class Account:
    """One owner's usage at ``since``, the GPUs it has held since then, and its grants and
    the units they hold (for limits)."""

    __slots__ = ("grants", "rate", "since", "units", "used")

    def __init__(self, now: float) -> None:
        self.used = 0.0
        self.since = now
        self.rate = 0.0
        self.grants = 0
        self.units = 0


class Usage:
    """Decayed GPU-seconds per owner, with the grants each holds (rules 8-9)."""

    __slots__ = ("_accounts", "_decay", "_grants", "_per_unit", "half_life", "shares")

    def __init__(
        self, totals: Sequence[int], shares: Mapping[Hashable, float], half_life: float
    ) -> None:
        self.shares = dict(shares)
        self.half_life = half_life
        self._decay = math.log(2.0) / half_life
        self._per_unit = [1.0 / total for total in totals]  # GPUs per unit on each GPU
        self._accounts: dict[Hashable, Account] = {}
        # ticket -> (its owner's account, GPU -> units it still holds), in grant order
        self._grants: dict[int, tuple[Account, dict[int, int]]] = {}

    def share(self, owner: Hashable) -> float:
        """``owner``'s share (1 for an owner the shares do not name)."""
        return self.shares.get(owner, 1.0)

    def _advance(self, account: Account, now: float) -> None:
        elapsed = now - account.since
        if elapsed > 0.0:
            lost = -math.expm1(-self._decay * elapsed)  # 1 - kept, exact for small ones
            account.used = account.used * (1.0 - lost) + account.rate * lost / self._decay
            account.since = now

    def usage(self, owner: Hashable, now: float) -> float:
        """``owner``'s decayed GPU-seconds at ``now`` (0 for an owner never granted)."""
        account = self._accounts.get(owner)
        if account is None:
            return 0.0
        self._advance(account, now)
        return account.used

    def ratio(self, owner: Hashable, now: float) -> float:
        """Usage over share: the smaller, the sooner the owner is served (rule 9)."""
        account = self._accounts.get(owner)
        if account is None:
            return 0.0
        if now > account.since:
            self._advance(account, now)
        return account.used / self.shares.get(owner, 1.0)

    def running(self, owner: Hashable) -> float:
        """GPUs ``owner`` holds now."""
        account = self._accounts.get(owner)
        return 0.0 if account is None else account.rate

    def grants(self, owner: Hashable) -> int:
        """How many grants ``owner`` holds now."""
        account = self._accounts.get(owner)
        return 0 if account is None else account.grants

    def units(self, owner: Hashable) -> int:
        """Units ``owner`` holds now, summed over its GPUs."""
        account = self._accounts.get(owner)
        return 0 if account is None else account.units

    def hold(self, owner: Hashable, held: Mapping[int, int], now: float) -> Account:
        """Count a grant of ``owner`` holding ``held`` (GPU -> units) from ``now``, kept by
        the caller (the hold-time records under ``easy``), which reports its end to
        :meth:`drop`; return the account to report it on."""
        account = self._accounts.get(owner)
        if account is None:
            account = self._accounts[owner] = Account(now)
        elif now > account.since:  # _advance, inline (this runs on every grant)
            lost = _expm1(-self._decay * (now - account.since))  # minus (1 - kept)
            account.used = account.used * (1.0 + lost) - account.rate * lost / self._decay
            account.since = now
        per_unit = self._per_unit
        for gpu, units in held.items():
            account.rate += units * per_unit[gpu]
            account.units += units
        account.grants += 1
        return account

    def hold_since(self, held: Mapping[int, int], start: float, now: float) -> Account:
        """Count a grant of the default owner (None) holding ``held`` since ``start``, found
        running when counting began at ``now``: what it has held so far, decayed, and what it
        holds from now."""
        account = self.hold(None, held, now)
        self.backdate(None, held, start, now)
        return account

    def backdate(self, owner: Hashable, held: Mapping[int, int], start: float, now: float) -> None:
        """Add to ``owner``'s usage what a grant holding ``held`` (counted from ``now``) used
        between ``start`` and ``now``, decayed: for a grant that began before it was counted
        (nothing if ``start`` is not before ``now``)."""
        account = self._accounts[owner]
        if now > account.since:
            self._advance(account, now)
        gpus = sum(units * self._per_unit[gpu] for gpu, units in held.items())
        elapsed = max(0.0, now - start)
        account.used -= gpus * _expm1(-self._decay * elapsed) / self._decay

    def drop(self, account: Account, gpu: int, units: int, now: float, ended: bool) -> None:
        """``units`` of a grant counted by :meth:`hold` given back on ``gpu`` at ``now``;
        ``ended``: that was the last of it."""
        if now > account.since:  # _advance, inline (this runs on every release)
            lost = _expm1(-self._decay * (now - account.since))  # minus (1 - kept)
            account.used = account.used * (1.0 + lost) - account.rate * lost / self._decay
            account.since = now
        account.rate -= units * self._per_unit[gpu]
        account.units -= units
        if ended:
            account.grants -= 1
            if account.grants == 0:
                account.rate = 0.0  # exactly: no drift from float sums once nothing is held
                account.units = 0

    def forget_grants(self, now: float) -> None:
        """Forget every grant held (their owners hold nothing from ``now``), keeping the
        usage counted so far: for a caller that rebuilds its grants from its own books."""
        for account in self._accounts.values():
            if now > account.since:
                self._advance(account, now)
            account.rate, account.grants, account.units = 0.0, 0, 0
        self._grants.clear()

    def start(
        self,
        ticket: int,
        owner: Hashable,
        held: Mapping[int, int] | Iterable[tuple[int, int]],
        now: float,
    ) -> None:
        """Record the grant ``ticket`` of ``owner`` holding ``held`` (GPU -> units, or pairs;
        copied) from ``now``."""
        account = self._accounts.get(owner)
        if account is None:
            account = self._accounts[owner] = Account(now)
        elif now > account.since:
            self._advance(account, now)
        parts = dict(held)
        per_unit = self._per_unit
        for gpu, units in parts.items():
            account.rate += units * per_unit[gpu]
            account.units += units
        account.grants += 1
        self._grants[ticket] = (account, parts)

    def finish(self, ticket: int | None, gpu: int, units: int, now: float) -> None:
        """Record ``units`` given back on ``gpu`` at ``now`` by ``ticket``; without a ticket
        (or one not held there) from a grant holding exactly that much there, else from the
        oldest ones (the rule the hold-time estimates use)."""
        if ticket is not None:
            record = self._grants.get(ticket)
            if record is not None and gpu in record[1]:
                self._take(ticket, record, gpu, units, now)
                return
        while units > 0:
            holders = [(t, r) for t, r in self._grants.items() if gpu in r[1]]
            if not holders:
                return
            guess = next(((t, r) for t, r in holders if r[1][gpu] == units), holders[0])
            taken = min(units, guess[1][1][gpu])
            self._take(guess[0], guess[1], gpu, taken, now)
            units -= taken

    def _take(
        self,
        ticket: int,
        record: tuple[Account, dict[int, int]],
        gpu: int,
        units: int,
        now: float,
    ) -> None:
        account, parts = record
        if now > account.since:
            self._advance(account, now)
        held = parts[gpu]
        taken = held if units > held else units
        account.rate -= taken * self._per_unit[gpu]
        account.units -= taken
        if taken < held:
            parts[gpu] = held - taken
            return
        del parts[gpu]
        if parts:
            return
        del self._grants[ticket]
        account.grants -= 1
        if account.grants == 0:
            account.rate = 0.0  # exactly: no drift from float sums once nothing is held
            account.units = 0


class OwnerQueue:
    """One owner's waiting tickets: higher priority first, FIFO within a priority (rule 10)."""

    __slots__ = ("levels", "priorities")

    def __init__(self) -> None:
        self.levels: dict[int, OrderedDict[int, None]] = {}
        self.priorities: list[int] = []  # the levels present, highest first

    def add(self, ticket: int, priority: int) -> None:
        level = self.levels.get(priority)
        if level is None:
            level = self.levels[priority] = OrderedDict()
            self.priorities.append(priority)
            self.priorities.sort(reverse=True)
        level[ticket] = None

    def remove(self, ticket: int, priority: int) -> None:
        level = self.levels[priority]
        del level[ticket]
        if not level:
            del self.levels[priority]
            self.priorities.remove(priority)

    def first(self) -> int:
        """The ticket served first: the earliest of the highest priority."""
        return next(iter(self.levels[self.priorities[0]]))

    def earliest(self) -> int:
        """The earliest-queued ticket, whatever its priority (ties between owners)."""
        if len(self.priorities) == 1:
            return next(iter(self.levels[self.priorities[0]]))
        return min(next(iter(self.levels[p])) for p in self.priorities)

    def __iter__(self) -> Iterator[int]:
        for priority in self.priorities:
            yield from self.levels[priority]
