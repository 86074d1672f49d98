"""Pipelining: many requests in flight on one connection, answered as each is decided.

Several asyncio tasks, or several threads, share one ``hwpool.connect()`` client, so one
connection. None of them waits for another's answer before sending its own request: all the
``acquire`` lines are on the wire before any of them is granted, and a request sent after them
(a status, a nowait question) is answered while they still wait.

Answers that arrive together are handed over together: the server writes the replies of one
turn of its loop to one connection at once, and the client's reader wakes the waiters of one
event loop with one ``call_soon_threadsafe`` for all of them.

A real ``hwpool serve`` whose GPUs are held by another connection, so that every request of
the pool under test must wait; the messages are those the client's connections send and read,
in the order the wire carried them. Every wait is for an event (a count of ``queued`` replies
read), bounded.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

import hwpool
from hostserver import BOUND, Server
from hwpool import UNITS_PER_GPU, GPUPool, WouldBlock
from hwpool._backends._unix_link import _Delivery
from hwpool._wire._connection import Wire
from hwpool._wire._protocol import (
    Acquire,
    Busy,
    ClientMessage,
    Granted,
    Queued,
    Release,
    ServerMessage,
    StatusReply,
    decode_client,
    encode,
)

StartServer = Callable[..., Server]
IN_FLIGHT = 8  # requests in flight at once on the connection under test


class Trace:
    """Every message the connections of this process sent and read, in the wire's order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[int, str, ClientMessage | ServerMessage]] = []
        self.queued: dict[int, int] = {}  # connection -> ``queued`` replies read
        self.changed = threading.Condition(self.lock)

    def of(self, pool: GPUPool) -> list[tuple[str, ClientMessage | ServerMessage]]:
        """What ``pool``'s connection sent (``"sent"``) and read (``"read"``), in order."""
        wire = id(pool._backend._wire)  # type: ignore[attr-defined]
        with self.lock:
            return [(way, message) for conn, way, message in self.events if conn == wire]

    def wait_queued(self, pool: GPUPool, count: int) -> bool:
        """Wait (bounded) until ``pool``'s connection has read ``count`` ``queued`` replies."""
        wire = id(pool._backend._wire)  # type: ignore[attr-defined]
        with self.changed:
            return self.changed.wait_for(lambda: self.queued.get(wire, 0) >= count, BOUND)


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Trace]:
    seen = Trace()
    send, read = Wire.send_bytes, Wire.read_batch

    def send_bytes(self: Wire, data: bytes) -> None:
        with seen.lock:  # noted before it leaves: an answer cannot be noted before its request
            for line in data.split(b"\n"):
                if line:
                    seen.events.append((id(self), "sent", decode_client(line + b"\n")))
        send(self, data)

    def read_batch(self: Wire) -> list[ServerMessage]:  # what the client's reader reads
        messages = read(self)
        with seen.changed:
            for message in messages:
                seen.events.append((id(self), "read", message))
                if isinstance(message, Queued):
                    seen.queued[id(self)] = seen.queued.get(id(self), 0) + 1
            seen.changed.notify_all()
        return messages

    monkeypatch.setattr(Wire, "send_bytes", send_bytes)
    monkeypatch.setattr(Wire, "read_batch", read_batch)
    yield seen


def _check_pipelined(trace: Trace, pool: GPUPool) -> None:
    """All IN_FLIGHT acquires were sent before the first grant was read, and each was granted
    once; a request sent after them was answered before any of them was granted."""
    events = trace.of(pool)
    acquires = [
        i for i, (way, m) in enumerate(events)
        if way == "sent" and isinstance(m, Acquire) and m.wait
    ]  # fmt: skip
    grants = [i for i, (way, m) in enumerate(events) if way == "read" and isinstance(m, Granted)]
    assert len(acquires) == IN_FLIGHT and len(grants) == IN_FLIGHT, events
    assert acquires[-1] < grants[0], "an acquire waited for an earlier one's grant to be sent"
    asked = {events[i][1].req for i in acquires}  # type: ignore[union-attr]
    assert {events[i][1].req for i in grants} == asked  # type: ignore[union-attr]
    later = [
        i for i, (way, m) in enumerate(events)
        if way == "read" and isinstance(m, StatusReply | Busy)
    ]  # fmt: skip
    assert len(later) == 2 and later[-1] < grants[0], "a later request waited for the earlier"


def test_tasks_of_one_loop_have_their_requests_in_flight_at_once(
    start_server: StartServer, trace: Trace
) -> None:
    server = start_server("--gpus", "1")
    holder, pool = hwpool.connect(server.socket), hwpool.connect(server.socket)
    try:
        gpu = holder.acquire_blocking(1.0)

        async def one() -> None:
            pool.release(await pool.acquire(1.0))

        async def main() -> None:
            tasks = [asyncio.ensure_future(one()) for _ in range(IN_FLIGHT)]
            queued = await asyncio.to_thread(trace.wait_queued, pool, IN_FLIGHT)
            assert queued, "the requests were not all queued at once"
            # sent after them, on the same connection, and answered while they all wait
            snapshot = await asyncio.to_thread(pool.snapshot)
            assert len(snapshot.waiting) == IN_FLIGHT
            with pytest.raises(WouldBlock):
                await asyncio.to_thread(pool.acquire_nowait, 1.0)
            assert not any(task.done() for task in tasks)
            holder.release(gpu)
            await asyncio.wait_for(asyncio.gather(*tasks), BOUND)

        asyncio.run(main())
        _check_pipelined(trace, pool)
    finally:
        holder.close()
        pool.close()


def test_threads_have_their_requests_in_flight_at_once(
    start_server: StartServer, trace: Trace
) -> None:
    server = start_server("--gpus", "1")
    holder, pool = hwpool.connect(server.socket), hwpool.connect(server.socket)
    try:
        gpu = holder.acquire_blocking(1.0)
        errors: list[BaseException] = []

        def one() -> None:
            try:
                pool.release(pool.acquire_blocking(1.0, timeout=BOUND))
            except BaseException as exc:  # reported by the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=one) for _ in range(IN_FLIGHT)]
        for thread in threads:
            thread.start()
        assert trace.wait_queued(pool, IN_FLIGHT), "the requests were not all queued at once"
        assert len(pool.snapshot().waiting) == IN_FLIGHT
        with pytest.raises(WouldBlock):
            pool.acquire_nowait(1.0)
        assert all(thread.is_alive() for thread in threads)
        holder.release(gpu)
        for thread in threads:
            thread.join(BOUND)
        assert not errors and not any(thread.is_alive() for thread in threads)
        _check_pipelined(trace, pool)
    finally:
        holder.close()
        pool.close()


def test_answers_read_together_reach_their_loop_in_one_hand_over(
    start_server: StartServer, trace: Trace
) -> None:
    server = start_server("--gpus", str(IN_FLIGHT))
    holder = Wire(server.socket)  # a raw connection: it gives all the GPUs back in one release
    pool = hwpool.connect(server.socket)
    handed: list[int] = []  # per hand-over of answers to the loop: how many it carried
    try:
        holder.send_bytes(encode(Acquire(1, IN_FLIGHT, UNITS_PER_GPU, True)))
        assert isinstance(holder.read(), Granted)

        async def main() -> list[int]:
            loop = asyncio.get_running_loop()
            threadsafe = loop.call_soon_threadsafe

            def counted(callback: Callable[..., object], *args: object) -> asyncio.Handle:
                if isinstance(callback, _Delivery):
                    handed.append(len(callback.reqs))
                return threadsafe(callback, *args)

            loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
            tasks = [asyncio.ensure_future(pool.acquire(1.0)) for _ in range(IN_FLIGHT)]
            queued = await asyncio.to_thread(trace.wait_queued, pool, IN_FLIGHT)
            assert queued, "the requests were not all queued at once"
            holder.send_bytes(encode(Release(2, 1)))  # all are granted in one turn of the server
            return await asyncio.wait_for(asyncio.gather(*tasks), BOUND)

        gpus = asyncio.run(main())
        assert sorted(gpus) == list(range(IN_FLIGHT))
        assert handed == [IN_FLIGHT], f"the grants reached the loop in {handed}"
        for gpu in gpus:
            pool.release(gpu)
    finally:
        holder.shutdown()
        pool.close()
