"""What a request that must wait puts on the wire: one ``acquire`` that waits, answered
``queued`` and then ``granted``, and no nowait question first (which would be a second round
trip, made before the wait, on the caller's thread).

A real ``hwpool serve``; the messages are those the client's connection sends and reads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

import hwpool
from hostserver import BOUND, Server
from hwpool import GPUPool
from hwpool._wire._connection import Wire
from hwpool._wire._protocol import (
    Acquire,
    ClientMessage,
    Granted,
    Queued,
    ServerMessage,
    decode_client,
)

StartServer = Callable[..., Server]
Ask = Callable[[GPUPool], Coroutine[Any, Any, None]]


class Trace:
    """The messages each connection sent and read, in order, as the wire carried them."""

    def __init__(self) -> None:
        self.sent: dict[int, list[ClientMessage]] = {}
        self.read: dict[int, list[ServerMessage]] = {}
        self.queued = threading.Event()  # some connection read a ``queued``

    def of(self, pool: GPUPool) -> tuple[list[ClientMessage], list[ServerMessage]]:
        """What ``pool``'s connection sent and read."""
        wire = pool._backend._wire  # type: ignore[attr-defined]
        return self.sent.get(id(wire), []), self.read.get(id(wire), [])


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Trace]:
    """Records every line a client connection of this process sends and every reply it reads."""
    seen = Trace()
    send, read = Wire.send_bytes, Wire.read_batch

    def send_bytes(self: Wire, data: bytes) -> None:
        lines = [line + b"\n" for line in data.split(b"\n") if line]
        seen.sent.setdefault(id(self), []).extend(decode_client(line) for line in lines)
        send(self, data)

    def read_batch(self: Wire) -> list[ServerMessage]:  # what the client's reader reads
        messages = read(self)
        seen.read.setdefault(id(self), []).extend(messages)
        if any(isinstance(message, Queued) for message in messages):
            seen.queued.set()
        return messages

    monkeypatch.setattr(Wire, "send_bytes", send_bytes)
    monkeypatch.setattr(Wire, "read_batch", read_batch)
    yield seen


async def _acquire(pool: GPUPool) -> None:
    pool.release(await pool.acquire(1.0))


async def _lease(pool: GPUPool) -> None:
    lease: AbstractAsyncContextManager[list[int]] = pool.lease(1.0)
    async with lease:
        pass


@pytest.mark.parametrize("ask", [_acquire, _lease], ids=["await acquire", "async with lease"])
def test_a_request_that_waits_sends_one_acquire_answered_queued_then_granted(
    start_server: StartServer, trace: Trace, ask: Ask
) -> None:
    server = start_server("--gpus", "1")
    holder, waiter = hwpool.connect(server.socket), hwpool.connect(server.socket)
    try:
        gpu = holder.acquire_blocking(1.0)

        async def main() -> None:
            task = asyncio.ensure_future(ask(waiter))
            queued = await asyncio.to_thread(trace.queued.wait, BOUND)
            assert queued, "the waiter's request was never queued"
            assert not task.done()
            holder.release(gpu)
            await asyncio.wait_for(task, BOUND)

        asyncio.run(main())
        sent, read = trace.of(waiter)
        acquires = [m for m in sent if isinstance(m, Acquire)]
        assert len(acquires) == 1, f"a waiting request sent {acquires}"
        assert acquires[0].wait
        req = acquires[0].req
        assert [type(m) for m in read if getattr(m, "req", None) == req] == [Queued, Granted]
    finally:
        holder.close()
        waiter.close()


def test_a_request_granted_at_once_sends_one_acquire_answered_granted(
    start_server: StartServer, trace: Trace
) -> None:
    server = start_server("--gpus", "1")
    pool = hwpool.connect(server.socket)
    try:
        asyncio.run(_acquire(pool))
        sent, read = trace.of(pool)
        acquires = [m for m in sent if isinstance(m, Acquire)]
        assert len(acquires) == 1 and acquires[0].wait
        req = acquires[0].req
        assert [type(m) for m in read if getattr(m, "req", None) == req] == [Granted]
    finally:
        pool.close()
