"""The workloads of ``bench_policy.py``: generated, seeded traces, and the checked-in ones.

Every generator takes a ``random.Random`` and a size, and returns tasks in arrival order, so a
seed gives the same trace on every machine. The aims each trace is for are in
``bench_policy.py``; here is only what the trace is:

- ``stream-50``/``-70``/``-90``: a steady Poisson stream of 0.1/0.25/0.5/1-GPU tasks at that
  load of four GPUs, with one 4-GPU task arriving a third of the way in (does it ever start
  while the stream runs?).
- ``heavy-tail``: lognormal durations (sigma 1.5, mean 2 s) and demands 0.1 to 2 GPUs at 95%
  load, so that a queue forms.
- ``gang``: gang jobs of 1 to 4 whole GPUs at 90% load.
- ``pack-0.6``: 1000 tasks of 0.6 GPU for 1 s at t=0 (no two share a GPU: the packing
  bound is 250 s where the work alone says 150 s).
- ``burst``: 10,000 mixed tasks at t=0.

The checked-in ones: P1-P3 (``tests/sim/traces``, in a source checkout only: the policy
flaws of issue 9) and the bundled examples ``batch`` and ``embedding``.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from pathlib import Path

from hwpool._core._capacity import UNITS_PER_GPU, fraction_to_units
from hwpool._sim._trace import Task, load_trace

GPUS = 4
FLAW_DIR = Path(__file__).resolve().parent.parent / "tests" / "sim" / "traces"
FLAWS = ("P1", "P2", "P3")
EXAMPLES = ("batch", "embedding")  # bundled, by demand (model-serving is by memory)
BIG = "big4"
"""The name of the 4-GPU task in each stream."""


def task(name: str, arrival: float, demand: float, duration: float) -> Task:
    """A task from a trace-style demand: a fraction in (0, 1], or a whole-GPU count >= 2."""
    if demand > 1:
        return Task(name, arrival, int(demand), UNITS_PER_GPU, duration)
    return Task(name, arrival, 1, fraction_to_units(demand), duration)


def _poisson(
    rng: random.Random,
    n: int,
    *,
    load: float,
    demands: tuple[float, ...],
    duration: Callable[[random.Random], float],
    mean_duration: float,
) -> list[Task]:
    """``n`` tasks arriving as a Poisson stream offering ``load`` times the GPUs' capacity."""
    mean_work = sum(d for d in demands) / len(demands) * mean_duration
    rate = load * GPUS / mean_work
    tasks, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        tasks.append(task(f"t{i}", t, rng.choice(demands), duration(rng)))
    return tasks


def stream(rng: random.Random, n: int, load: float) -> list[Task]:
    """A steady stream of small tasks (uniform 0.5-3.5 s) with one 4-GPU task of 10 s."""
    tasks = _poisson(
        rng,
        n,
        load=load,
        demands=(0.1, 0.25, 0.5, 1.0),
        duration=lambda r: r.uniform(0.5, 3.5),
        mean_duration=2.0,
    )
    big = Task(BIG, tasks[n // 3].arrival, GPUS, UNITS_PER_GPU, 10.0)
    return sorted([*tasks, big], key=lambda t: t.arrival)


def heavy_tail(rng: random.Random, n: int) -> list[Task]:
    """Lognormal durations, sigma 1.5, mean 2 s; demands 0.1 to 2 GPUs; 95% load."""
    sigma = 1.5
    mu = math.log(2.0) - sigma**2 / 2
    return _poisson(
        rng,
        n,
        load=0.95,
        demands=(0.1, 0.25, 0.5, 1.0, 2.0),
        duration=lambda r: r.lognormvariate(mu, sigma),
        mean_duration=2.0,
    )


def gang(rng: random.Random, n: int) -> list[Task]:
    """Gang jobs of 1 to 4 whole GPUs, 1 to 10 s, at 90% load."""
    return _poisson(
        rng,
        n,
        load=0.9,
        demands=(1.0, 2.0, 3.0, 4.0),
        duration=lambda r: r.uniform(1.0, 10.0),
        mean_duration=5.5,
    )


def pack(n: int) -> list[Task]:
    """``n`` tasks of 0.6 GPU for 1 s, all at t=0."""
    return [task(f"p{i}", 0.0, 0.6, 1.0) for i in range(n)]


def burst(rng: random.Random, n: int) -> list[Task]:
    """``n`` mixed tasks (0.1 to 2 GPUs, 0.5 to 3.5 s) all at t=0."""
    demands = (0.1, 0.25, 0.5, 1.0, 2.0)
    return [task(f"b{i}", 0.0, rng.choice(demands), rng.uniform(0.5, 3.5)) for i in range(n)]


def generated(seed: int, quick: bool) -> dict[str, Callable[[], list[Task]]]:
    """The generated traces by name, each drawn lazily from its own seeded generator."""
    scale = 10 if quick else 1

    def rng(offset: int) -> random.Random:
        return random.Random(seed * 1000 + offset)

    return {
        "stream-50": lambda: stream(rng(1), 4000 // scale, 0.5),
        "stream-70": lambda: stream(rng(2), 4000 // scale, 0.7),
        "stream-90": lambda: stream(rng(3), 4000 // scale, 0.9),
        "heavy-tail": lambda: heavy_tail(rng(4), 4000 // scale),
        "gang": lambda: gang(rng(5), 2000 // scale),
        "pack-0.6": lambda: pack(1000 // scale),
        "burst": lambda: burst(rng(6), 10_000 // scale),
    }


def checked_in() -> dict[str, Callable[[], list[Task]]]:
    """The flaw traces (where this is a source checkout) and the bundled examples."""
    traces: dict[str, Callable[[], list[Task]]] = {}
    for name in FLAWS:
        path = FLAW_DIR / f"{name}.csv"
        if path.is_file():
            traces[name] = functools.partial(load_trace, str(path), max_gpus=GPUS)
    for name in EXAMPLES:
        traces[name] = functools.partial(load_trace, name, max_gpus=GPUS)
    return traces


def all_traces(seed: int, quick: bool) -> dict[str, Callable[[], list[Task]]]:
    """Every trace of the benchmark by name, checked-in ones first."""
    return {**checked_in(), **generated(seed, quick)}
