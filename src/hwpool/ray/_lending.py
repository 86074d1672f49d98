"""The driver's kept leases: tasks launched by the driver itself on leases its client lends it.

Through the client a task costs two messages more than a plain Ray task (driver -> client ->
worker and back), which for short tasks is most of their cost. So the client lends the driver
the leases it keeps (:meth:`ClientActor.lend`, a call the driver keeps pending) and the driver
launches a task of the same demand on one itself: its ``ObjectRef`` is the task's, and submit
and result cost what they cost for plain Ray, plus a lookup here. The lease stays the
client's for the scheduler (a restarted scheduler restores it from there, and the client's
death frees it); the driver gives it back (:meth:`ClientActor.give_back`) when it has been idle
about ``keep_s`` (between one and two: it is looked at when the lend call returns), when its
task failed with its node, after a recall (someone waits: its idle leases at once, its busy
ones as their tasks end), and at close.

A task goes this way only while none of the driver's earlier calls through the client is
unfinished, so it never passes one of them in the queue. Unlike a task launched by the client,
one whose node dies before it starts fails rather than asking again: its ``ObjectRef`` is the
user's already.

Everything here runs on the driver's threads and on Ray's callback thread, under one lock.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from ray.exceptions import NodeDiedError, TaskUnschedulableError

from .._core._scheduler import Demand
from . import _api
from ._client import Launchers, Lent, TaskOptions
from ._state import Placement

__all__ = ["LentLeases"]

SETTLE_AT_MOST = 8
"""Unfinished calls through the client a launch asks Ray about before giving up on a lent
lease (Ray may run a finished call's completion callback only after ``ray.get`` returned it)."""

_NODE_LOST = (NodeDiedError, TaskUnschedulableError)


class LentLeases:
    """The leases a driver's client lent it: idle ones by demand, busy ones by number."""

    def __init__(self, client: Any, keep_s: float) -> None:
        self._client = client
        self._keep_s = keep_s
        self._launchers = Launchers(bind_repeated=True)
        self._lock = threading.Lock()
        self._idle: dict[Demand, dict[int, tuple[Placement, float]]] = {}
        self._busy: dict[int, tuple[Any, Demand, Placement]] = {}  # ref None while launching
        self._recalled: set[int] = set()  # busy leases to give back when their tasks end
        self._through_client: dict[Any, None] = {}  # the driver's unfinished calls there
        self._polling = False
        self._closed = False
        self.launched = 0  # tasks launched here (for tests and benchmarks)

    def held(self) -> tuple[int, int]:
        """How many lent leases are idle and how many busy now."""
        with self._lock:
            return sum(map(len, self._idle.values())), len(self._busy)

    # ----------------------------------------------------------------- the driver's calls
    def launch(
        self,
        fn: Callable[..., Any],
        demand: Demand,
        options: TaskOptions,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Launch ``fn`` on an idle lent lease of ``demand`` and return its ``ObjectRef``;
        None if there is none to use (the call then goes through the client)."""
        if not self._settled():
            return None
        taken = self._take(demand)
        if taken is None:
            return None
        number, placement = taken
        try:
            ref = self._launchers.launch(fn, options, placement, args, kwargs)
        except BaseException:
            with self._lock:
                del self._busy[number]
                self._idle.setdefault(demand, {})[number] = (placement, time.monotonic())
            raise
        with self._lock:
            self._busy[number] = (ref, demand, placement)
            self.launched += 1
        ref.future().add_done_callback(functools.partial(self._ended, number, ref))
        return ref

    def through_client(self, ref: Any) -> None:
        """The driver made a call through the client (answered by ``ref``): no task goes
        this way until it is finished; and the client may lend from now on."""
        with self._lock:
            self._through_client[ref] = None
            start = not self._polling and not self._closed
            self._polling = self._polling or start
        ref.future().add_done_callback(functools.partial(self._call_finished, ref))
        if start:
            self._poll(None)

    def close(self) -> None:
        """Stop the tasks launched here that still run (the client, killed next, frees their
        leases). One that has ended, though Ray has not called back yet, is not cancelled:
        Ray 2.x can crash the driver when a cancel crosses a task's last reply
        (ray-project/ray#54527); asking first leaves only a task ending at that very moment
        exposed."""
        with self._lock:
            self._closed = True
            self._idle.clear()
            busy = [ref for ref, _, _ in self._busy.values() if ref is not None]
        if not busy:
            return
        _, running = _api.wait(busy, num_returns=len(busy), timeout=0)
        for ref in running:
            _api.cancel(ref, force=True)

    # ----------------------------------------------------------------- internals
    def _take(self, demand: Demand) -> tuple[int, Placement] | None:
        """An idle lent lease of ``demand``, now busy: its number and placement. A lease
        whose task has ended counts as idle though Ray has not called back yet (it may do so
        after ``ray.get`` returned the result: a stream of tasks would otherwise go through
        the client every other time)."""
        with self._lock:
            if self._closed:
                return None
            if not self._idle.get(demand):
                ended = {
                    ref: number
                    for number, (ref, d, _) in self._busy.items()
                    if d == demand and ref is not None
                }
                if not ended:
                    return None
            else:
                ended = {}
        if ended:
            ready, _ = _api.wait(list(ended)[:SETTLE_AT_MOST], num_returns=1, timeout=0)
            for ref in ready:
                self._end(ended[ref], ref, _lost_node(ref))
        with self._lock:
            idle = self._idle.get(demand)
            if not idle or self._closed:
                return None
            number, (placement, _) = idle.popitem()
            if not idle:
                del self._idle[demand]
            self._busy[number] = (None, demand, placement)
            return number, placement

    def _settled(self) -> bool:
        """Whether none of the driver's calls through the client is unfinished; asks Ray
        about a few (their completion callbacks may not have run yet)."""
        with self._lock:
            if not (self._idle or self._busy):
                return False
            pending = list(self._through_client)
        if not pending:
            return True
        if len(pending) > SETTLE_AT_MOST:
            return False
        ready, _ = _api.wait(pending, num_returns=len(pending), timeout=0)
        with self._lock:
            for ref in ready:
                self._through_client.pop(ref, None)
            return not self._through_client

    def _call_finished(self, ref: Any, _future: Any) -> None:
        with self._lock:
            self._through_client.pop(ref, None)

    def _ended(self, number: int, ref: Any, future: Any) -> None:
        self._end(number, ref, isinstance(future.exception(), _NODE_LOST))

    def _end(self, number: int, ref: Any, node_lost: bool) -> None:
        """Lent lease ``number``'s task (``ref``) ended: keep the lease idle for the next
        task of its demand, or give it back (recalled, closing, or its node lost). Once per
        task: the second caller (Ray's callback or a launch that saw it ready) finds it
        done."""
        with self._lock:
            entry = self._busy.get(number)
            if entry is None or entry[0] is not ref:
                return
            del self._busy[number]
            recalled = number in self._recalled
            self._recalled.discard(number)
            if not (node_lost or recalled or self._closed):
                _, demand, placement = entry
                self._idle.setdefault(demand, {})[number] = (placement, time.monotonic())
                return
        self._give_back([(number, node_lost)])

    def _poll(self, wait_s: float | None) -> None:
        """Ask the client for leases; it answers when it lends some, on a recall, or after
        ``wait_s`` (so that idle leases are looked at again)."""
        try:
            self._client.lend.remote(wait_s).future().add_done_callback(self._answered)
        except Exception:  # Ray is shutting down
            self._gone()

    def _answered(self, future: Any) -> None:
        try:
            lent, recalled = future.result()
        except Exception:  # the client is gone (closed, or its driver's Ray shut down)
            self._gone()
            return
        now = time.monotonic()
        returned: list[tuple[int, bool]] = []
        with self._lock:
            if self._closed:
                return
            if recalled:
                returned += [(n, False) for idle in self._idle.values() for n in idle]
                self._idle.clear()
                self._recalled.update(self._busy)
            item: Lent
            for item in lent:
                number, demand, placement = item
                self._idle.setdefault(demand, {})[number] = (placement, now)
            returned += self._expired(now)
            held = bool(self._idle or self._busy)
        if returned:
            self._give_back(returned)
        self._poll(self._keep_s if held else None)

    def _expired(self, now: float) -> list[tuple[int, bool]]:
        """Take out the idle leases unused for ``keep_s``, to be given back (under the lock)."""
        expired: list[tuple[int, bool]] = []
        for demand in list(self._idle):
            idle = self._idle[demand]
            for number, (_, since) in list(idle.items()):
                if now - since >= self._keep_s:
                    del idle[number]
                    expired.append((number, False))
            if not idle:
                del self._idle[demand]
        return expired

    def _give_back(self, returned: list[tuple[int, bool]]) -> None:
        with contextlib.suppress(Exception):  # the client is gone: its leases went with it
            self._client.give_back.remote(returned)

    def _gone(self) -> None:
        """The client is gone: its leases are free at the scheduler, so what runs on them
        here must stop."""
        self.close()


def _lost_node(ref: Any) -> bool:
    """Whether the task of ``ref`` (ended) failed with its node."""
    try:
        _api.get(ref, timeout=0)
    except _NODE_LOST:
        return True
    except Exception:  # the task's own error, or another of Ray's
        return False
    return False
