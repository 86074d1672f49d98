"""The client over a server that stops, hangs or restarts: it never blocks an event loop, honours
every timeout, never drops a request, and waits for a restarting server whether or not it had
anything in flight.

Real ``hwpool serve`` processes; a stopped server is SIGSTOPped, a restarting one is a socket
that accepts and closes (tests/notaserver.py) until the real server is started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hwpool
from hostserver import BOUND, ENV, Server, status_of
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from interactive import interactive
from notaserver import NotAServer
from runproc import eventually, waiting_pids

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


@contextlib.contextmanager
def stopped(server: Server) -> Iterator[None]:
    """The server is SIGSTOPped inside (alive, accepting, answering nothing)."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``work`` in a thread; the list gets its result or the exception it raised."""
    out: list[object] = []

    def target() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def readers_of(backend: UnixBackend) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.ident in backend._readers]


def lose_the_server(server: Server, backend: UnixBackend) -> None:
    """SIGKILL ``server`` and wait until ``backend`` (idle) has seen the connection close."""
    server.kill()
    for thread in readers_of(backend):
        thread.join(BOUND)  # an idle client's reader ends once it has seen the loss
        assert not thread.is_alive()


# ----------------------------------------------------------------- a stopped server (item 13)
def test_an_await_on_a_stopped_server_times_out_and_leaves_the_loop_running(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    pool = hwpool.connect(server.socket)
    ticks: list[int] = []
    outcomes: list[str] = []

    async def main() -> None:
        async def tick() -> None:
            while True:
                ticks.append(len(ticks))
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0)
        before = len(ticks)
        try:
            await asyncio.wait_for(pool.acquire(1.0), 0.5)
        except TimeoutError:
            outcomes.append("wait_for")
        try:
            await pool.acquire(1.0, timeout=0.5)
        except TimeoutError:
            outcomes.append("timeout=")
        outcomes.append("ticked" if len(ticks) > before + 1 else "the loop stood still")
        ticker.cancel()

    with stopped(server):
        thread, _ = in_thread(lambda: asyncio.run(main()))
        thread.join(BOUND)
        done = not thread.is_alive()
    thread.join(BOUND)
    assert done, "the event loop was blocked by a stopped server"
    assert outcomes == ["wait_for", "timeout=", "ticked"]
    assert status_of(server.socket)["waiting"] == []  # both were withdrawn
    pool.close()


def test_a_blocking_wait_on_a_stopped_server_honours_its_timeout(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    pool = hwpool.connect(server.socket)
    with stopped(server):
        thread, out = in_thread(lambda: pool.acquire_blocking(timeout=0.5))
        thread.join(BOUND)
        done = not thread.is_alive()
    thread.join(BOUND)
    assert done, "acquire_blocking(timeout=0.5) outlasted its timeout on a stopped server"
    assert len(out) == 1 and isinstance(out[0], TimeoutError)
    assert status_of(server.socket)["waiting"] == []
    pool.close()


# ----------------------------------------------------------------- never dropped (item 16)
def test_a_request_made_as_the_connection_drops_is_sent_once_a_server_is_back(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    backend = UnixBackend(server.socket, reconnect_timeout=BOUND)
    looked = backend._connected

    def looked_then_lost() -> None:
        """The request has looked at its connection; then the connection drops, the reader
        sees it (nothing is held: it stops), and a server comes back, all before the request
        is posted."""
        looked()
        del backend._connected  # once
        lose_the_server(server, backend)
        start_server("--gpus", "1")

    backend._connected = looked_then_lost  # type: ignore[method-assign]
    grant = backend.acquire_blocking(Demand(1, FULL), BOUND)
    assert grant.gpus == (0,)
    backend.release(grant)
    backend.close()


# ----------------------------------------------------------------- an idle client (item 17)
def test_an_idle_client_waits_for_a_restarting_server(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    pool = hwpool.connect(server.socket, reconnect_timeout=BOUND)
    lose_the_server(server, pool._backend)  # type: ignore[arg-type]
    with NotAServer(server.socket) as restarting:
        thread, out = in_thread(lambda: pool.acquire_blocking(timeout=BOUND))
        restarting.wait_for(1)  # the request is made and tried the socket
    start_server("--gpus", "1")
    thread.join(BOUND)
    assert out == [0]
    pool.release(0)
    pool.close()


def test_an_idle_async_client_waits_for_a_restarting_server(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    pool = hwpool.connect(server.socket, reconnect_timeout=BOUND)
    lose_the_server(server, pool._backend)  # type: ignore[arg-type]

    async def main() -> int:
        with NotAServer(server.socket) as restarting:
            task = asyncio.create_task(pool.acquire(1.0, timeout=BOUND))
            await asyncio.to_thread(restarting.wait_for, 1)
            assert not task.done()
        await asyncio.to_thread(start_server, "--gpus", "1")
        return await task

    assert asyncio.run(main()) == 0
    pool.release(0)
    pool.close()


def test_a_status_asked_while_the_server_restarts_is_answered_once_it_is_back(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    pool = hwpool.connect(server.socket, reconnect_timeout=BOUND)
    lose_the_server(server, pool._backend)  # type: ignore[arg-type]
    with NotAServer(server.socket) as restarting:
        thread, out = in_thread(pool.snapshot)
        restarting.wait_for(1)
    start_server("--gpus", "1")
    thread.join(BOUND)
    assert len(out) == 1 and getattr(out[0], "free", None) == (1.0,)
    pool.close()


def test_a_client_that_gives_up_on_a_restart_says_so_within_its_bound(
    start_server: StartServer,
) -> None:
    server = start_server("--gpus", "1")
    pool = hwpool.connect(server.socket, reconnect_timeout=0.2)
    lose_the_server(server, pool._backend)  # type: ignore[arg-type]
    gave_up = pytest.raises(ConnectionError, match=r"reconnect_timeout=0\.2s")
    with NotAServer(server.socket), gave_up:
        pool.acquire_blocking(timeout=BOUND)
    pool.close()


@pytest.mark.parametrize("bound", [-1, float("nan"), float("inf"), "30"])
def test_a_bad_reconnect_timeout_is_refused_before_connecting(sockdir: Path, bound: object) -> None:
    error = TypeError if isinstance(bound, str) else ValueError
    with pytest.raises(error, match=f"reconnect_timeout.*{bound!r}"):
        hwpool.connect(sockdir / "none.sock", reconnect_timeout=bound)  # type: ignore[arg-type]


# ----------------------------------------------------------------- Ctrl-C (item 21)
WAITER = """\
import signal, sys
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand

backend = UnixBackend(sys.argv[1])  # its reader thread, started here, takes the signals
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
try:
    backend.acquire_blocking(Demand(1, UNITS_PER_GPU), None)
except KeyboardInterrupt:
    print("interrupted", flush=True)
backend.close()
"""


def test_ctrl_c_that_lands_as_the_waiter_sleeps_still_interrupts_it(
    start_server: StartServer,
) -> None:
    # A SIGINT that lands on the main thread just before it sleeps is acted on only once it
    # wakes, as is one that another thread takes: the second, arranged here by blocking
    # SIGINT in the main thread, is the first made deterministic.
    server = start_server("--gpus", "1")
    with hwpool.connect(server.socket) as pool, pool.lease(1.0):
        proc = subprocess.Popen(  # interactive: the SIGINT below must reach it under nohup
            interactive([sys.executable, "-c", WAITER, str(server.socket)]),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=ENV,
        )  # fmt: skip
        try:
            eventually(lambda: waiting_pids(server.socket) == [proc.pid], "it waits")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=BOUND)
        finally:
            if proc.poll() is None:  # it hung: end it, the assertion below says so
                proc.kill()
                out, err = proc.communicate()
        assert (proc.returncode, out) == (0, "interrupted\n"), err
        assert status_of(server.socket)["waiting"] == []
