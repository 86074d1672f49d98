"""The GPU suite runs over both backends: the in-process pool and a real ``hwpool serve``.

A test that takes ``make_pool`` runs twice: ``make_pool(n)`` is ``GPUPool(n)``, then
``hwpool.connect()`` to a server of ``n`` GPUs (one per count, shared by the session). Each
server test ends by closing its pools (the server frees what they held before ``close``
returns) and checking, over a fresh connection, that the server holds nothing: a leak into
the server fails the test that made it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import hwpool
from hostserver import MakePool, Server, ServerFarm
from hwpool import GPUPool


@pytest.fixture(scope="session")
def server_farm() -> Iterator[ServerFarm]:
    farm = ServerFarm()
    yield farm
    farm.close()


@pytest.fixture(params=["local", "server"])
def make_pool(request: pytest.FixtureRequest, server_farm: ServerFarm) -> Iterator[MakePool]:
    pools: list[tuple[int, GPUPool]] = []

    def make(num_gpus: int) -> GPUPool:
        if request.param == "local":
            pool = GPUPool(num_gpus)
        else:
            pool = hwpool.connect(server_farm.socket(num_gpus), reconnect_timeout=0)
        pools.append((num_gpus, pool))
        return pool

    yield make
    for _, pool in pools:
        pool.close()
    if request.param == "server":
        for num_gpus in {n for n, _ in pools}:
            with hwpool.connect(server_farm.socket(num_gpus)) as probe:
                snap = probe.snapshot()
            assert snap.free == (1.0,) * num_gpus and snap.waiting == (), "left on the server"


@pytest.fixture(params=["local", "server"])
def sized_pool(request: pytest.FixtureRequest) -> Iterator[Callable[..., GPUPool]]:
    """``sized_pool(sizes)``: ``GPUPool(gpu_memory=sizes)``, then ``hwpool.connect()`` to a
    fresh ``hwpool serve --gpu-memory SIZES`` (fresh, so that no hold time learned by an
    earlier test changes what the policy lets backfill). The server must hold nothing once
    the test has closed its pools."""
    directory = Path(tempfile.mkdtemp(prefix="hws", dir="/tmp"))
    made: list[tuple[GPUPool, Server | None]] = []
    servers: list[Server] = []  # every one started, ready or not, is killed at the end

    def make(sizes: Sequence[int | str]) -> GPUPool:
        if request.param == "local":
            made.append((GPUPool(gpu_memory=sizes), None))
        else:
            text = ",".join(f"{s}MiB" if isinstance(s, int) else s for s in sizes)
            servers.append(Server(directory / f"{len(servers)}.sock", "--gpu-memory", text))
            pool = hwpool.connect(servers[-1].ready().socket, reconnect_timeout=0)
            made.append((pool, servers[-1]))
        return made[-1][0]

    try:
        yield make
        for pool, server in made:
            pool.close()
            if server is not None:
                with hwpool.connect(server.socket) as probe:
                    snap = probe.snapshot()
                assert snap.free_mib == snap.total_mib and snap.waiting == (), "left on the server"
    finally:
        for server in servers:
            server.kill()
        shutil.rmtree(directory, ignore_errors=True)
