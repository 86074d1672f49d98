"""Write the policy-flaw traces P1, P2 and P3 (issue 9) beside this script, as CSV.

Each trace is built to show one flaw of the old scheduling policy (``hwpool-reserve-all`` in
the simulator) on four GPUs; README.md in this folder says which. P1 and P3 are fixed
patterns; P2's stream is drawn from a seeded generator, so the files are the same on every
run. The CSVs are checked in; ``tests/sim/test_policy_flaws.py`` reads them and also checks
that this script still writes exactly them (run it again after changing it).

Run: ``python tests/sim/traces/make_traces.py`` (writes P1.csv, P2.csv, P3.csv here).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 9  # issue 9
Row = tuple[float, float, float, str]
"""One task as a trace writes it: (arrival, demand, duration, name)."""


def p1() -> list[Row]:
    """Every waiter reserves: 4 x 0.6 GPU run 100 s, 4 whole-GPU waiters reserve all four
    GPUs, and 400 tiny tasks that would fit beside the 0.6s wait for them."""
    rows: list[Row] = [(0.0, 0.6, 100.0, f"big{i}") for i in range(4)]
    rows += [(0.1, 1.0, 10.0, f"whole{i}") for i in range(4)]
    rows += [(round(0.2 + i / 10, 3), 0.1, 1.0, f"small{i}") for i in range(400)]
    return rows


def p2(seed: int = SEED) -> list[Row]:
    """The head reserves the most free GPUs, not those that free up first.

    GPUs 0 and 1 each run a 0.1-GPU task for 300 s (placed by best fit beside a 0.9-GPU filler
    that ends at t=100); from t=1, a 0.25-GPU task of 1.8 to 1.95 s arrives every 0.25 s, so
    that 7 or 8 of them always run: they fill GPUs 2 and 3, and neither ever drains. At t=100
    the fillers end and a 2-GPU head arrives: GPUs 0-1 (0.9 free each) are the most free, so
    the old policy reserves them, lets the stream backfill GPUs 2-3 and starts the head when
    the 0.1s end, at t=300. Strict FIFO holds the stream back and starts the head on GPUs 2-3
    once their short tasks drain (under 2 s).
    """
    rng = random.Random(seed)
    rows: list[Row] = [
        (0.0, 0.1, 300.0, "long0"),
        (0.0, 0.9, 100.0, "filler0"),
        (0.0, 0.1, 300.0, "long1"),
        (0.0, 0.9, 100.0, "filler1"),
        (100.0, 2, 10.0, "head"),
    ]
    for i in range(1276):  # every 0.25 s from t=1 to t=319.75
        rows.append((1.0 + i / 4, 0.25, round(rng.uniform(1.8, 1.95), 3), f"s{i}"))
    return rows


def p3(steps: int = 600) -> list[Row]:
    """Reservations hop: a whole-GPU head waits while the stream runs, all jobs <= 3.5 s.

    Every GPU holds one or two tasks of 0.35 to 0.49 GPU, never none, and the fractions shrink
    by a hair with each task. Each step (every 0.45 s) one task ends, leaving its GPU a little
    more free than the GPU the head reserves, so the old policy moves the reservation there;
    0.05 s later a task arrives that fits only on the GPU just given up (three never share a
    GPU), so that GPU never drains. The head waits until the stream stops. Under strict FIFO
    (or a head that keeps its reservation) a GPU drains within a few seconds.
    """
    tau, eps, t0 = 0.45, 0.05, 0.5
    first, last = 0.49, 0.35

    def fraction(k: int) -> float:  # k from -6 (the first task at t=0) to steps - 1
        return round(first - (first - last) * (k + 6) / (steps + 6), 6)

    def end(k: int) -> float:  # task k ends at step k + 7
        return t0 + (k + 7) * tau

    # At t=0, best fit pairs them up in this order: {-3, z0}, {-6, -2}, {-5, -1}, {-4, z1}.
    # z0 and z1 end at t0, where the head arrives: two GPUs then hold one task each.
    rows: list[Row] = []
    for k in (-3, None, -6, -2, -5, -1, -4, None):
        if k is None:
            rows.append((0.0, 0.45, t0, f"z{len(rows) // 6}"))
        else:
            rows.append((0.0, fraction(k), round(end(k), 3), f"init{-k}"))
    rows.append((t0, 1.0, 3.5, "head"))
    for k in range(steps):
        arrival = round(t0 + k * tau + eps, 3)
        rows.append((arrival, fraction(k), round(7 * tau - eps, 3), f"s{k}"))
    return rows


TRACES = {"P1": p1, "P2": p2, "P3": p3}


def render(rows: list[Row], title: str) -> str:
    """The CSV text of a trace: a comment line, the header, one line per task."""
    lines = [f"# {title} (written by make_traces.py)", "arrival,demand,duration,name"]
    lines += [f"{a:.10g},{d:.10g},{u:.10g},{n}" for a, d, u, n in rows]
    return "\n".join(lines) + "\n"


def texts() -> dict[str, str]:
    """Each trace's file name and CSV text."""
    return {
        f"{name}.csv": render(make(), f"{name}: {(make.__doc__ or '').splitlines()[0]}")
        for name, make in TRACES.items()
    }


def main(argv: list[str] | None = None) -> None:
    """Write every trace into this folder (or the folder given as the one argument)."""
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else HERE
    for filename, text in texts().items():
        (folder / filename).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
