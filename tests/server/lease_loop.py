"""A client for the kill/restart loop: takes and gives back leases until told to stop.

``python lease_loop.py SOCKET OUT SEED STOP``: until the file STOP exists, acquire a random
share of a GPU (a quarter, a half or a whole one), hold it a few milliseconds, release it,
then idle a few milliseconds (so that the host is empty at times, as after a quiet spell).
Each lease is written to OUT as ``lease GPU UNITS START END``: monotonic seconds (the clock
is the same in every process), from the moment the grant is known until just before the
release is sent, a span within the server's own. A request that fails (the server is away
for longer than its timeout) is written as ``retry ERROR`` and made again; a lease the
restarted server refused to give back as ``lost ...`` (from the client's warning).
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from typing import TextIO

from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand

SHARES = (UNITS_PER_GPU // 4, UNITS_PER_GPU // 2, UNITS_PER_GPU)


class _Lost(logging.Handler):
    """Writes the client's 'lease ... is lost' warnings to OUT."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(logging.WARNING)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "lost" in text:
            self.out.write(f"lost {text}\n")


def connect(socket: str) -> UnixBackend:
    """The first connection, made again while the server is away (for 20 s at most)."""
    deadline = time.monotonic() + 20.0
    while True:
        try:
            return UnixBackend(socket, reconnect_timeout=20.0)
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> None:
    socket, out_path, seed, stop = sys.argv[1:5]
    rng = random.Random(int(seed))
    with open(out_path, "a", buffering=1) as out:
        logging.getLogger("hwpool").addHandler(_Lost(out))
        backend = connect(socket)
        while not os.path.exists(stop):
            units = rng.choice(SHARES)
            try:
                grant = backend.acquire_blocking(Demand(1, units), 5.0)
            except (TimeoutError, ConnectionError) as exc:
                out.write(f"retry {type(exc).__name__}\n")
                time.sleep(0.05)  # the server is away: do not spin
                continue
            start = time.monotonic()
            time.sleep(rng.random() * 0.02)
            out.write(f"lease {grant.gpus[0]} {units} {start!r} {time.monotonic()!r}\n")
            backend.release(grant)
            time.sleep(rng.random() * 0.05)  # idle now and then: the host is sometimes empty
        backend.close()


if __name__ == "__main__":
    main()
