"""What the charts draw, computed without matplotlib: colours, bar placement and binned series.

A chart cannot show more tasks than it has pixels, so beyond :data:`DETAIL_BARS` bars a Gantt
lane shows, per time bin, how much of the GPU each demand class held on average, instead of one
bar per task; the GPUs-in-use and wait panels are binned the same way. Every series here costs
time linear in the number of tasks (plus the bins), and the binning is done by NumPy (which
matplotlib needs anyway, so it is imported only when a chart is drawn): 200,000 tasks chart in
seconds.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._core._capacity import UNITS_PER_GPU
from .._sim._simulate import Outcome, TaskRun

__all__ = [
    "DETAIL_BARS",
    "LANE",
    "ClassKey",
    "Occupancy",
    "bin_intervals",
    "class_colour",
    "class_keys",
    "class_keys_of",
    "occupancy",
    "placed",
    "share",
    "usage_bins",
    "usage_steps",
    "wait_bins",
]

LANE = 0.8  # height of one GPU's lane in the Gantt chart
DETAIL_BARS = 2000  # above this many bars in one Gantt chart, lanes show binned occupancy
ClassKey = tuple[int, int, int]  # (count, units, memory MiB or 0): one demand class (Task.key)

_FIXED_COLOURS = {  # the common classes keep one colour in every chart (tab10 colours)
    (1, UNITS_PER_GPU // 10, 0): "#1f77b4",  # 0.1 GPU: blue
    (1, UNITS_PER_GPU // 8, 0): "#17becf",  # cyan
    (1, UNITS_PER_GPU // 5, 0): "#bcbd22",  # olive
    (1, UNITS_PER_GPU // 4, 0): "#2ca02c",  # green
    (1, UNITS_PER_GPU * 3 // 10, 0): "#e377c2",  # pink
    (1, UNITS_PER_GPU // 2, 0): "#ff7f0e",  # orange
    (1, UNITS_PER_GPU * 3 // 4, 0): "#8c564b",  # brown
    (1, UNITS_PER_GPU, 0): "#9467bd",  # 1 GPU: purple
    (2, UNITS_PER_GPU, 0): "#d62728",  # 2 GPUs: red
    (4, UNITS_PER_GPU, 0): "#7f7f7f",  # grey
    (8, UNITS_PER_GPU, 0): "#393b79",  # dark blue
    # Common memory requests (tab20b): distinct from each other and from the above.
    (1, 0, 2 * 1024): "#e7ba52",  # 2 GiB: gold
    (1, 0, 6 * 1024): "#5254a3",  # 6 GiB: indigo
    (1, 0, 16 * 1024): "#637939",  # 16 GiB: olive green
    (1, 0, 24 * 1024): "#ce6dbd",  # 24 GiB: orchid
    (1, 0, 40 * 1024): "#843c39",  # 40 GiB: dark red
    (1, 0, 44 * 1024): "#843c39",  # 44 GiB: dark red
}
_OTHER_COLOURS = (  # tab20b, for the other classes, chosen by a stable hash of the class
    "#393b79", "#5254a3", "#6b6ecf", "#9c9ede", "#637939", "#8ca252", "#b5cf6b", "#cedb9c",
    "#8c6d31", "#bd9e39", "#e7ba52", "#e7cb94", "#843c39", "#ad494a", "#d6616b", "#e7969c",
    "#7b4173", "#a55194", "#ce6dbd", "#de9ed6",
)  # fmt: skip


def class_colour(key: ClassKey) -> str:
    """The colour of a demand class: the same in every chart the command draws."""
    fixed = _FIXED_COLOURS.get(key)
    if fixed is not None:
        return fixed
    return _OTHER_COLOURS[zlib.crc32(repr(key).encode()) % len(_OTHER_COLOURS)]


def class_keys(outcomes: Sequence[Outcome]) -> list[ClassKey]:
    """The demand classes of the outcomes' tasks, smallest first."""
    return sorted({key for o in outcomes for key in class_keys_of(o.runs)})


def class_keys_of(runs: Sequence[TaskRun]) -> list[ClassKey]:
    """The demand classes of ``runs``, smallest first."""
    return sorted({r.task.key for r in runs})


def share(run: TaskRun) -> float:
    """The share of each of its GPUs ``run`` held (a memory task: of the GPU it ran on)."""
    return run.task.units / UNITS_PER_GPU if run.share is None else run.share


def placed(result: Outcome) -> list[tuple[TaskRun, int, float]]:
    """(run, gpu, vertical offset) per bar: the lowest offset free of the runs active at start."""
    bars: list[tuple[TaskRun, int, float]] = []
    active: dict[int, list[tuple[float, float, float]]] = {}  # gpu -> (end, bottom, top)
    for run in sorted(result.runs, key=lambda r: (r.start, r.task.arrival)):
        height = LANE * share(run)
        for gpu in run.gpus:
            kept = [span for span in active.get(gpu, []) if span[0] > run.start]
            bottom = 0.0
            for low, high in sorted((b, t) for _, b, t in kept):
                if bottom + height <= low + 1e-9:
                    break
                bottom = max(bottom, high)
            bottom = min(bottom, LANE - height)
            active[gpu] = [*kept, (run.end, bottom, bottom + height)]
            bars.append((run, gpu, bottom))
    return bars


def _numpy() -> Any:
    return importlib.import_module("numpy")


def bin_intervals(begin: Any, end: Any, weight: Any, group: Any, *, groups: int, bins: int) -> Any:
    """Sum weighted intervals into unit-width bins, per group: an array ``(groups, bins)``.

    ``begin``, ``end`` (in bins, clipped to ``[0, bins]``), ``weight`` and ``group`` are
    arrays of one entry per interval; bin ``b`` gets ``weight`` times the length of the
    interval's overlap with ``[b, b + 1)``. Whole bins go through a difference array, so the
    cost is linear in the intervals plus the bins.
    """
    np = _numpy()
    begin, end = np.clip(begin, 0, bins), np.clip(end, 0, bins)
    first = np.minimum(begin.astype(np.int64), bins - 1)
    last = np.minimum(end.astype(np.int64), bins - 1)
    apart = first != last
    row = group * (bins + 1)
    size = groups * (bins + 1)
    head = np.where(apart, first + 1 - begin, end - begin) * weight
    parts = np.bincount(row + first, head, size)
    parts += np.bincount((row + last)[apart], ((end - last) * weight)[apart], size)
    steps = np.bincount((row + first + 1)[apart], weight[apart], size)
    steps -= np.bincount((row + last)[apart], weight[apart], size)
    whole = np.cumsum(steps.reshape(groups, bins + 1), axis=1)
    return (parts.reshape(groups, bins + 1) + whole)[:, :bins]


@dataclass(frozen=True, slots=True)
class Occupancy:
    """Mean share of each GPU held by each demand class, per time bin of width ``width``.

    ``shares[g, k, b]``: GPU ``g``, class ``keys[k]``, bin ``b`` (a NumPy array).
    """

    width: float
    keys: tuple[ClassKey, ...]
    shares: Any

    def edges(self) -> Any:
        """The bin edges, in seconds."""
        bins = self.shares.shape[2]
        return _numpy().arange(bins + 1) * self.width


def occupancy(result: Outcome, end: float, bins: int) -> Occupancy:
    """Bin ``result`` over ``[0, end]``: each run adds its share, pro rata, to the bins it spans."""
    np = _numpy()
    keys = tuple(class_keys([result]))
    index = {key: i for i, key in enumerate(keys)}
    width = max(end, 1e-9) / bins
    begin, finish, shares, group = [], [], [], []
    for run in result.runs:
        k = index[run.task.key]
        for gpu in run.gpus:
            begin.append(run.start)
            finish.append(run.end)
            shares.append(share(run))
            group.append(gpu * len(keys) + k)
    binned = bin_intervals(
        np.array(begin) / width, np.array(finish) / width,
        np.array(shares, dtype=float), np.array(group, dtype=np.int64),
        groups=result.num_gpus * len(keys), bins=bins,
    )  # fmt: skip
    return Occupancy(width, keys, binned.reshape(result.num_gpus, len(keys), bins))


def usage_steps(runs: Sequence[TaskRun]) -> tuple[list[float], list[float]]:
    """GPUs in use as a step function: (change times, level from each time on)."""
    changes: dict[float, float] = {}
    for run in runs:
        amount = run.task.count * share(run)
        changes[run.start] = changes.get(run.start, 0.0) + amount
        changes[run.end] = changes.get(run.end, 0.0) - amount
    times, used, level = [], [], 0.0
    for time in sorted(changes):
        level += changes[time]
        times.append(time)
        used.append(max(0.0, level))
    return times, used


def usage_bins(runs: Sequence[TaskRun], end: float, bins: int) -> tuple[Any, Any]:
    """GPUs in use, averaged over each of ``bins`` bins of ``[0, end]``: (bin edges, means)."""
    np = _numpy()
    width = max(end, 1e-9) / bins
    begin = np.array([run.start for run in runs]) / width
    finish = np.array([run.end for run in runs]) / width
    amount = np.array([run.task.count * share(run) for run in runs])
    used = bin_intervals(begin, finish, amount, np.zeros(len(runs), np.int64), groups=1, bins=bins)
    return np.arange(bins + 1) * width, used[0]


def wait_bins(runs: Sequence[TaskRun], end: float, bins: int) -> tuple[Any, dict[ClassKey, Any]]:
    """Per class, the worst wait of the tasks arriving in each bin: (bin middles, waits).

    A bin where no task of the class arrived holds NaN, so a line drawn through the bins
    breaks there and a rare class shows as a few points.
    """
    np = _numpy()
    width = max(end, 1e-9) / bins
    keys = class_keys_of(runs)
    index = {key: i for i, key in enumerate(keys)}
    slot = np.minimum((np.array([r.task.arrival for r in runs]) / width).astype(np.int64), bins - 1)
    row = np.array([index[r.task.key] for r in runs], dtype=np.int64)
    worst = np.full((len(keys), bins), -np.inf)
    np.maximum.at(worst, (row, slot), np.array([r.wait for r in runs]))
    worst[np.isinf(worst)] = np.nan
    return (np.arange(bins) + 0.5) * width, {key: worst[i] for i, key in enumerate(keys)}
