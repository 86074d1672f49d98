"""The host server's uncontended grant round trip, against a bare echo and the in-process pool.

One client, no contention: acquire half a GPU, release it, again. Measured in one run, the
contenders interleaved and each figure the best of several rounds:

1. a bare echo round trip of the same line over the same kind of socket (a Unix stream
   socket served by an ``asyncio.Protocol``), from a blocking client: the floor for any
   request/reply server in Python on this machine;
2. the same echo answered through a reader thread and a ``threading.Event``, as the hwpool
   client receives its replies (so that any number of threads and loops share one socket);
3. ``acquire_blocking(0.5)`` + ``release`` on ``hwpool.connect()``, a GPUPool over ``hwpool
   serve`` (the release is not waited for), and the same with ``await acquire``;
4. a request that must wait: on a one-GPU server whose GPU this client holds, ``await
   acquire()`` is sent, then the held GPU released on the same connection (so the server
   always reads the request first and queues it), timed from the send to the grant: one round
   trip (``acquire``, answered ``queued``, then ``granted`` on the release), as an ``acquire``
   granted at once costs;
5. the same pair on the in-process ``GPUPool``;
6. ``acquire_blocking(memory="40GiB")`` + ``release`` on a server sized in memory
   (``--gpu-memory 80GiB,...``): what asking in MiB costs against asking for a share;
7. pipelined: ``PIPELINE`` asyncio tasks of one loop share one ``hwpool.connect()`` client
   (one connection), each doing ``await acquire(0.5)`` + ``release`` in turn, so that up to
   ``PIPELINE`` requests are in flight on the connection at once (they all fit: never a wait);
   timed per grant, against the echo pipelined the same way (``PIPELINE`` lines in flight on
   one socket, a new one sent for each echoed).

Aim: the server's grant round trip at most 2x the bare echo, whether granted at once or after
a wait, alone or pipelined; the memory server's at most 1.2x the fraction server's. Run:
``python bench/bench_server.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import hwpool
from _hostserver import echo_server, host_server
from hwpool import UNITS_PER_GPU, GPUPool
from hwpool._wire._protocol import Acquire, encode

GPUS = 8
LINE = encode(Acquire(12345, 1, UNITS_PER_GPU // 2, True))
PIPELINE = 8  # requests in flight at once on one connection (8 halves of 8 GPUs: all fit)


def echo_inline(path: Path, n: int) -> float:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(path))
    start = time.perf_counter()
    for _ in range(n):
        sock.sendall(LINE)
        sock.recv(65536)
    elapsed = time.perf_counter() - start
    sock.close()
    return elapsed / n


def echo_pipelined(path: Path, n: int, depth: int = PIPELINE) -> float:
    """Seconds per echoed line with ``depth`` lines in flight on one socket: ``depth`` sent
    at once, then one more for each line that comes back, until ``n`` came back."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(path))
    start = time.perf_counter()
    sock.sendall(LINE * depth)
    sent, back = depth, 0
    while back < n:
        came = sock.recv(65536).count(b"\n")  # each line has one newline, however cut
        back += came
        more = min(came, n - sent)
        if more > 0:
            sock.sendall(LINE * more)
            sent += more
    elapsed = time.perf_counter() - start
    sock.close()
    return elapsed / n


def echo_threaded(path: Path, n: int) -> float:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(path))
    events: list[threading.Event] = []

    def reader() -> None:
        while sock.recv(65536):
            events[0].set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    start = time.perf_counter()
    for _ in range(n):
        events[:] = [threading.Event()]
        sock.sendall(LINE)
        events[0].wait()
    elapsed = time.perf_counter() - start
    sock.shutdown(socket.SHUT_RDWR)
    thread.join()
    sock.close()
    return elapsed / n


def blocking_pairs(pool: GPUPool, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        pool.release(pool.acquire_blocking(0.5), 0.5)
    return (time.perf_counter() - start) / n


def memory_pairs(pool: GPUPool, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        pool.release(pool.acquire_blocking(memory="40GiB"), memory="40GiB")
    return (time.perf_counter() - start) / n


def async_pairs(pool: GPUPool, n: int) -> float:
    async def pairs() -> float:
        start = time.perf_counter()
        for _ in range(n):
            pool.release(await pool.acquire(0.5), 0.5)
        return (time.perf_counter() - start) / n

    return asyncio.run(pairs())


def pipelined_pairs(pool: GPUPool, n: int, depth: int = PIPELINE) -> float:
    """Seconds per grant with ``depth`` tasks of one loop each doing ``await acquire(0.5)`` +
    ``release`` in turn on ``pool`` (one connection): up to ``depth`` requests in flight."""
    each = max(1, n // depth)

    async def worker() -> None:
        for _ in range(each):
            pool.release(await pool.acquire(0.5), 0.5)

    async def pairs() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(depth)))
        return (time.perf_counter() - start) / (each * depth)

    return asyncio.run(pairs())


def waiting_pairs(pool: GPUPool, n: int) -> float:
    """Seconds per request that waits in the queue of a one-GPU server for a release.

    The GPU is held; each round sends ``acquire`` (its task runs up to its await: the request
    is on the wire), then releases the held GPU on the same connection, so that the server
    reads the request first and queues it, and the release grants it, to be held next round.
    """

    async def pairs() -> float:
        gpu = await pool.acquire(1.0)
        start = time.perf_counter()
        for _ in range(n):
            waiter = asyncio.ensure_future(pool.acquire(1.0))
            await asyncio.sleep(0)  # the waiter's acquire is sent
            pool.release(gpu)
            gpu = await waiter
        elapsed = time.perf_counter() - start
        pool.release(gpu)
        return elapsed / n

    return asyncio.run(pairs())


def measure(n: int, rounds: int) -> dict[str, float]:
    """Best-of-``rounds`` seconds per round trip for each contender, interleaved."""
    results: dict[str, list[float]] = {}
    sizes = ",".join(["80GiB"] * GPUS)
    with (
        echo_server() as echo,
        host_server(GPUS) as (path, _),
        host_server(None, "--gpu-memory", sizes) as (sized_path, _),
        host_server(1) as (one_path, _),
    ):
        shared, sized = hwpool.connect(path), hwpool.connect(sized_path)
        one = hwpool.connect(one_path)
        pool = GPUPool(GPUS)
        cases: list[tuple[str, Callable[[], float]]] = [
            ("echo", lambda: echo_inline(echo, n)),
            ("echo_thread", lambda: echo_threaded(echo, n)),
            ("server", lambda: blocking_pairs(shared, n)),
            ("server_async", lambda: async_pairs(shared, n)),
            ("server_wait", lambda: waiting_pairs(one, n)),
            ("server_memory", lambda: memory_pairs(sized, n)),
            ("echo_pipelined", lambda: echo_pipelined(echo, n)),
            ("server_pipelined", lambda: pipelined_pairs(shared, n)),
            ("local", lambda: blocking_pairs(pool, n * 10)),
        ]
        for _, case in cases:  # warm-up
            case()
        for _ in range(rounds):
            for name, case in cases:
                results.setdefault(name, []).append(case())
        shared.close()
        sized.close()
        one.close()
    return {name: min(values) for name, values in results.items()}


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark and return its table (also printed when run as a script)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred pairs (a smoke run)")
    args = parser.parse_args(argv)
    n, rounds = (200, 1) if args.quick else (3000, 5)
    f = measure(n, rounds)
    us = {name: value * 1e6 for name, value in f.items()}
    rows = [
        ("bare echo, blocking client", us["echo"], 1.0, ""),
        ("bare echo via a reader thread", us["echo_thread"], us["echo_thread"] / us["echo"], ""),
        ("hwpool serve: acquire_blocking + release", us["server"], us["server"] / us["echo"],
         "<= 2.0"),
        ("hwpool serve: await acquire + release", us["server_async"],
         us["server_async"] / us["echo"], ""),
        ("hwpool serve: await acquire that waits + release", us["server_wait"],
         us["server_wait"] / us["echo"], "<= 2.0"),
        ("in-process GPUPool: acquire_blocking + release", us["local"], us["local"] / us["echo"],
         ""),
        ("hwpool serve --gpu-memory: 40GiB acquire + release", us["server_memory"],
         us["server_memory"] / us["echo"], ""),
        (f"bare echo, {PIPELINE} in flight on one socket", us["echo_pipelined"],
         us["echo_pipelined"] / us["echo"], ""),
        (f"hwpool serve: {PIPELINE} in flight, await acquire + release", us["server_pipelined"],
         us["server_pipelined"] / us["echo"], ""),
    ]  # fmt: skip
    lines = [
        f"hwpool serve round trip, uncontended  (Python {platform.python_version()}, "
        f"{platform.machine()}, best of {rounds} rounds of {n})",
        f"{'measure':<54}{'us':>10}{'x echo':>9}  aim",
        *(f"{name:<54}{value:>10.1f}{ratio:>9.2f}  {aim}" for name, value, ratio, aim in rows),
        f"server vs echo through a reader thread: {us['server'] / us['echo_thread']:.2f}x; "
        f"server vs in-process pool: {us['server'] / us['local']:.0f}x",
        "a request that waits vs one granted at once (await): "
        f"{us['server_wait'] / us['server_async']:.2f}x  (one round trip each: about 1)",
        f"memory server vs fraction server: {us['server_memory'] / us['server']:.2f}x  "
        "(aim <= 1.2)",
        f"pipelined ({PIPELINE} in flight), per grant: server vs echo pipelined the same way: "
        f"{us['server_pipelined'] / us['echo_pipelined']:.2f}x  (aim <= 2.0); vs the server "
        f"one at a time (await): {us['server_pipelined'] / us['server_async']:.2f}x",
    ]
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
