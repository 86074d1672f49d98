"""The core after a KeyboardInterrupt at any line of any of its inputs (issue 22, item 7).

The core's calls are not atomic; a caller that sees an exception come out of one rebuilds the
core from what it knows (``Scheduler.rebuild``). Here a caller keeps that record: what it
holds and what waits. For every public input, in states with and without a queue, on GPUs of
one size and of several, under both policies, KeyboardInterrupt is raised at line event
1, 2, ... inside ``hwpool/_core`` until the call runs through. After each: the caller counts a
request cut short as never made and a release or cancel as done, rebuilds, and then the
invariants hold (per GPU free + held == total; every ticket waiting, held or gone, never two;
reservations disjoint and held by waiters only), the core holds exactly what the caller
thinks, and releasing and cancelling everything leaves every GPU free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from hwpool._core._scheduler import Demand, Grant, Scheduler
from injection import Injection, every_line

U = 1_000
FRACTION = Demand(1, 400)
HALF = Demand(1, 500)
PAIR = Demand(2, U, whole=True)


class Caller:
    """A front in miniature: the core, what its callers hold and what still waits."""

    def __init__(self, core: Scheduler) -> None:
        self.core = core
        self.held: dict[int, tuple[tuple[int, int], ...]] = {}
        self.waiting: dict[int, tuple[Demand, float | None]] = {}
        self.clock = 0.0

    def tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def take(self, grants: Sequence[Grant]) -> None:
        for grant in grants:
            del self.waiting[grant.ticket]
            self.held[grant.ticket] = self.core.held(grant)

    # ------------------------------------------------------------- the core's inputs
    def submit(self, demand: Demand, hint: float | None = None) -> None:
        ticket, grant = self.core.submit(demand, now=self.tick(), expected=hint)
        if grant is None:
            self.waiting[ticket] = (demand, hint)
        else:
            self.held[ticket] = self.core.held(grant)

    def grant_now(self, demand: Demand, hint: float | None = None) -> None:
        grant = self.core.grant_now(demand, now=self.tick(), expected=hint)
        if grant is not None:
            self.held[grant.ticket] = self.core.held(grant)

    def release(self, ticket: int) -> None:
        parts = self.held.pop(ticket)  # given back from here on, whatever happens below
        now = self.tick()
        if len(parts) == 1:
            self.take(self.core.release(*parts[0], ticket=ticket, now=now))
        else:
            self.take(self.core.release_many(parts, ticket=ticket, now=now))

    def cancel(self, ticket: int) -> None:
        del self.waiting[ticket]  # withdrawn from here on
        self.take(self.core.cancel(ticket, now=self.tick()))

    def restore(self, gpus: tuple[int, ...], units: int) -> None:
        grant = self.core.restore(gpus, units, now=self.tick())
        self.held[grant.ticket] = self.core.held(grant)

    # ------------------------------------------------------------- after an exception
    def rebuild(self) -> None:
        waiting = [(ticket, demand, hint) for ticket, (demand, hint) in self.waiting.items()]
        self.take(self.core.rebuild(self.held.items(), waiting, now=self.tick()))

    def check(self) -> None:
        """The invariants, and the core agrees with this record."""
        core = self.core
        used = [0] * core.num_gpus
        for parts in self.held.values():
            for gpu, units in parts:
                used[gpu] += units
        assert [f + u for f, u in zip(core.free, used, strict=True)] == list(core.totals)
        queued = [w.ticket for w in core.waiters()]
        assert queued == sorted(self.waiting), "the queue is not what the caller thinks waits"
        assert not set(queued) & set(self.held)
        reserved = [gpu for gpus in core.reservations().values() for gpu in gpus]
        assert len(reserved) == len(set(reserved))
        assert set(core.reservations()) <= set(queued)

    def finish(self) -> None:
        """Release everything, then cancel what still waits: every GPU ends free."""
        while self.held:
            self.release(min(self.held))
            self.check()
        while self.waiting:
            self.cancel(min(self.waiting))
            self.check()
        assert self.core.free == self.core.totals and self.core.queue_length == 0


def busy(policy: str, sizes: Sequence[int] | None, *, queue: bool) -> Caller:
    """Grants on every GPU and, with ``queue``, requests waiting behind them."""
    core = Scheduler(4, U, policy=policy) if sizes is None else Scheduler(sizes, policy=policy)
    caller = Caller(core)
    for demand in (HALF, HALF, FRACTION, PAIR):
        caller.submit(demand)
    caller.release(max(caller.held))  # something learned, for easy's estimates
    caller.submit(PAIR, hint=5.0)
    if queue:
        for demand, hint in ((PAIR, None), (HALF, None), (FRACTION, 2.0), (HALF, None)):
            caller.submit(demand, hint)
        assert caller.waiting
    caller.check()
    return caller


Operation = Callable[[Caller], None]

OPERATIONS: dict[str, Operation] = {
    "submit": lambda c: c.submit(FRACTION),
    "submit-whole": lambda c: c.submit(PAIR),
    "submit-hinted": lambda c: c.submit(HALF, hint=1.0),
    "grant_now": lambda c: c.grant_now(Demand(1, 100)),
    "release": lambda c: c.release(min(t for t, p in c.held.items() if len(p) == 1)),
    "release_many": lambda c: c.release(min(t for t, p in c.held.items() if len(p) > 1)),
    "cancel-head": lambda c: c.cancel(min(c.waiting)),
    "cancel-last": lambda c: c.cancel(max(c.waiting)),
}
SIZES = {"one-size": None, "mixed-sizes": (U, 2 * U, U // 2, 2 * U)}


def interrupted(make: Callable[[], Caller], operation: Operation) -> int:
    """Inject at every line of ``operation``; check the caller's view after each."""

    def run(injection: Injection) -> None:
        caller = make()
        try:
            with injection.active():
                operation(caller)
        except KeyboardInterrupt:
            assert injection.fired
            caller.rebuild()
        caller.check()
        caller.finish()

    return every_line(run)


# Every input with and without a queue, but a cancel only with one (nothing waits without).
CASES = [
    pytest.param(name, queue, id=f"{name}-{'queue' if queue else 'no-queue'}")
    for name in OPERATIONS
    for queue in (True, False)
    if queue or not name.startswith("cancel")
]


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize(("name", "queue"), CASES)
def test_keyboard_interrupt_at_every_line_of_an_input(
    policy: str, sizes: Sequence[int] | None, queue: bool, name: str
) -> None:
    injected = interrupted(lambda: busy(policy, sizes, queue=queue), OPERATIONS[name])
    assert injected > 3  # the call ran through several lines of the core


@pytest.mark.parametrize("policy", ["easy", "reserve-all"])
def test_keyboard_interrupt_at_every_line_of_restore(policy: str) -> None:
    def make() -> Caller:
        caller = Caller(Scheduler(3, U, policy=policy))
        caller.restore((0,), 300)
        return caller

    assert interrupted(make, lambda c: c.restore((1, 2), 600)) > 3


def test_keyboard_interrupt_at_every_line_of_rebuild_itself() -> None:
    # A second interrupt, during the repair: the caller just rebuilds again.
    def operation(caller: Caller) -> None:
        caller.rebuild()

    assert interrupted(lambda: busy("easy", None, queue=True), operation) > 10


def test_rebuild_of_a_sound_core_changes_nothing_it_keeps() -> None:
    caller = busy("easy", None, queue=True)
    free, queue = caller.core.free, [w.ticket for w in caller.core.waiters()]
    caller.rebuild()
    caller.check()
    assert caller.core.free == free and [w.ticket for w in caller.core.waiters()] == queue


@pytest.mark.parametrize(
    ("held", "waiting", "error", "match"),
    [
        ([(1, ((0, 600),)), (2, ((0, 600),))], [], ValueError, "cannot hold 1200 units on GPU 0"),
        ([(1, ((0, 100), (0, 100)))], [], ValueError, "distinct GPUs"),
        ([(1, ())], [], ValueError, "at least one"),
        ([(1, ((7, 100),))], [], ValueError, "gpu_id"),
        ([(1, ((0, 0),))], [], ValueError, "units to release"),
        ([("1", ((0, 100),))], [], TypeError, "ticket must be an int"),
        ([(1, ((0, 100),))], [(1, FRACTION, None)], ValueError, "tickets must be distinct"),
        ([], [(2, Demand(1, 2 * U), None)], ValueError, "units must be between"),
        ([], [(2, FRACTION, -1.0)], ValueError, "expected"),
        ([], [(None, FRACTION, None)], TypeError, "ticket must be an int"),
    ],
)
def test_rebuild_refuses_bad_input_and_changes_nothing(
    held: list[tuple[object, tuple[tuple[int, int], ...]]],
    waiting: list[tuple[object, Demand, float | None]],
    error: type[Exception],
    match: str,
) -> None:
    caller = busy("easy", None, queue=True)
    before = caller.core.free, list(caller.core.waiters()), caller.core.head
    with pytest.raises(error, match=match):
        caller.core.rebuild(held, waiting)  # type: ignore[arg-type]
    assert (caller.core.free, list(caller.core.waiters()), caller.core.head) == before
    caller.finish()
