"""A client process for the server tests: reads commands on stdin, reports on stdout.

``python client_proc.py SOCKET``, then lines such as ``acquire a 0.5``, ``full b 2``,
``mem c 6144`` (MiB, on a server sized in memory), ``release a``, ``exit``. Each acquire
runs in its own thread, so that the process can go on taking commands while it waits; it
prints ``granted NAME [gpus]`` or ``error NAME TYPE``. Hand-over: ``give a`` prints
``given a ID TICKET``; ``take b ID TICKET`` prints ``granted b [gpus]`` (or ``error b TYPE``).
"""

from __future__ import annotations

import sys
import threading

from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU, fraction_to_units
from hwpool._core._scheduler import Demand, Grant


def main() -> None:
    backend = UnixBackend(
        sys.argv[1], reconnect_timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    )
    held: dict[str, Grant] = {}
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            print(line, flush=True)

    def acquire(name: str, demand: Demand) -> None:
        try:
            grant = backend.acquire_blocking(demand, None)
        except Exception as exc:
            say(f"error {name} {type(exc).__name__}")
            return
        held[name] = grant
        say(f"granted {name} {list(grant.gpus)}")

    say("ready")
    for line in sys.stdin:
        words = line.split()
        if words[0] == "acquire":
            demand = Demand(1, fraction_to_units(float(words[2])))
        elif words[0] == "mem":
            demand = Demand(1, int(words[2]))
        elif words[0] == "full":
            demand = Demand(int(words[2]), UNITS_PER_GPU)
        elif words[0] == "release":
            backend.release(held.pop(words[1]))
            say(f"released {words[1]}")
            continue
        elif words[0] == "give":
            grant = held.pop(words[1])
            ident = backend.lease_id(grant.ticket)
            say(f"given {words[1]} {ident} {backend.give(grant)}")
            continue
        elif words[0] == "take":
            try:
                held[words[1]] = backend.take(int(words[2]), words[3])
            except Exception as exc:
                say(f"error {words[1]} {type(exc).__name__}")
                continue
            say(f"granted {words[1]} {list(held[words[1]].gpus)}")
            continue
        else:
            break
        threading.Thread(target=acquire, args=(words[1], demand), daemon=True).start()
    backend.close()
    say("bye")


if __name__ == "__main__":
    main()
