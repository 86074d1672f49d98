"""The fake GPU machine of the watch tests: a fake NVML's state file and the server watching it.

The server loads ``tests/fakes/nvml_file/pynvml.py`` (first on its PYTHONPATH), which reads
the machine from a JSON file the test rewrites (:meth:`Machine.set`): a process appears on a
GPU, uses memory, disappears, or NVML fails.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.nvml_file import DIRECTORY, gpu, write_state
from hostserver import BOUND, ENV, SRC, Server, status_of

UUID = "GPU-00000000-1111-2222-3333-444444444444"
TOTAL = 16384  # MiB


class Machine:
    """The fake machine's state file and the server watching it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.state = directory / "nvml.json"
        self.socket = directory / "s.sock"
        self.server: Server | None = None
        self.set()

    def set(
        self, processes: dict[int, int | None] | None = None, failing: dict[str, str] | None = None
    ) -> None:
        """The GPU with ``processes`` (pid -> MiB) on it; NVML ``failing`` as given."""
        used = sum(mib or 0 for mib in (processes or {}).values())
        write_state(self.state, [gpu(UUID, TOTAL, used_mib=used, utilization=37,
                                     processes=processes)], failing)  # fmt: skip

    def start(self, *args: str, memory: bool = True) -> Server:
        """A server on the fake GPU, sized in memory unless not ``memory`` (fractions)."""
        env = {k: v for k, v in ENV.items() if k not in ("HWPOOL_NUM_GPUS", "CUDA_VISIBLE_DEVICES")}
        env.update(PYTHONPATH=f"{DIRECTORY}{os.pathsep}{SRC}", HWPOOL_FAKE_NVML=str(self.state))
        sized = ("--memory",) if memory else ()
        self.server = Server(self.socket, *sized, "--watch-interval", "0.05", *args, env=env)
        self.server.ready()
        self.server.wait_for("watching with NVML")
        return self.server

    def status(self) -> dict[str, Any]:
        return status_of(self.socket)

    def until(self, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """Poll ``hwpool status --json`` until ``check`` holds (bounded)."""
        deadline = time.monotonic() + BOUND
        while True:
            status = self.status()
            if check(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"never: {what}; last status: {status}")
            time.sleep(0.02)


@pytest.fixture
def machine(sockdir: Path) -> Iterator[Machine]:
    found = Machine(sockdir)
    yield found
    if found.server is not None:
        found.server.kill()
