"""Cost of hwpool.page_nodes on a resident array: move_pages against the numa_maps fallback.

Run: PYTHONPATH=src python bench/numa_page_nodes.py [MiB]  (default 256). Prints the time of one
call through each path (best of 5) and their ratio; both must report the same nodes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from hwpool._numa._kernel import LinuxKernel
from hwpool._numa._pages import sample_pages


class NoMovePages(LinuxKernel):
    """The real kernel with move_pages refused, as under a seccomp filter."""

    def page_nodes(self, addrs: Sequence[int]) -> list[int]:
        raise PermissionError(1, "refused for the benchmark")


def best_of(fn: Callable[[], object], runs: int = 5) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    data = np.ones(mib << 20, dtype=np.uint8)
    fast, nodes = best_of(lambda: dict(sample_pages(data).nodes))
    slow, fallback = best_of(lambda: dict(sample_pages(data, kernel=NoMovePages()).nodes))
    assert nodes == fallback, (nodes, fallback)
    print(f"{mib} MiB, 4096 sampled pages, nodes {nodes}")
    print(f"move_pages: {fast * 1e3:.1f} ms  numa_maps: {slow * 1e3:.1f} ms", end="  ")
    print(f"ratio {slow / fast:.2f}")


if __name__ == "__main__":
    main()
