"""Charts of schedules (needs matplotlib): a Gantt chart per policy, GPUs in use, and waits.

matplotlib is the optional ``plot`` extra; it is imported only when a chart is asked for, and
:func:`require_matplotlib` turns its absence into one clear message. The chart's format comes
from the file's extension, checked by :func:`check_format` before any work.

One colour per demand class, the same in every chart (:func:`~._plot_data.class_colour`);
policies are told apart by line style. Each class is one collection of bars per Gantt chart,
not one artist per task, and charts of many tasks are binned (see :mod:`._plot_data`).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._sim._simulate import Outcome
from ._plot_data import (
    DETAIL_BARS,
    LANE,
    ClassKey,
    class_colour,
    class_keys,
    occupancy,
    placed,
    share,
    usage_bins,
    usage_steps,
    wait_bins,
)

__all__ = [
    "INSTALL_HINT",
    "PlotUnavailableError",
    "check_format",
    "figure",
    "plot_outcomes",
    "require_matplotlib",
]

INSTALL_HINT = "plotting needs matplotlib: pip install 'hwpool[plot]'"
STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))  # one per policy
MARKERS = ("o", "x", "^", "s", "D", "v")  # with the style, for isolated points
WIDTH_IN, DPI = 11.0, 110
BINS = 1000  # time bins of a binned Gantt lane: about one per pixel of the axes
WAIT_BINS = 150


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend; PlotUnavailableError if absent."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotUnavailableError(INSTALL_HINT) from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def check_format(path: str) -> str:
    """The image format ``path``'s extension names; ValueError if none or not one matplotlib
    writes. Needs matplotlib (call :func:`require_matplotlib` first)."""
    canvas = importlib.import_module("matplotlib.backend_bases").FigureCanvasBase
    formats = sorted(canvas.get_supported_filetypes())
    suffix = Path(path).suffix.lower().removeprefix(".")
    if not suffix:
        raise ValueError(f"{path!r} has no extension to name the format, e.g. {path}.png")
    if suffix not in formats:
        raise ValueError(f"cannot write {suffix!r} images ({path!r}); use {', '.join(formats)}")
    return suffix


def plot_outcomes(outcomes: Sequence[Outcome], path: str, title: str) -> None:
    """Write one image (format from the extension) of :func:`figure`."""
    plt = require_matplotlib()
    fmt = check_format(path)
    fig = figure(outcomes, title)
    try:
        fig.savefig(path, dpi=DPI, format=fmt)
    finally:
        plt.close(fig)


def figure(outcomes: Sequence[Outcome], title: str) -> Any:
    """A matplotlib figure: a Gantt chart per outcome, GPUs in use over time, waits by arrival."""
    plt = require_matplotlib()
    n, num_gpus = len(outcomes), outcomes[0].num_gpus
    gantt = min(max(1.6, 0.45 * num_gpus), 6.0)
    heights = [gantt] * n + [2.0, 2.0]
    fig, axes = plt.subplots(
        n + 2, 1, figsize=(WIDTH_IN, sum(heights) + 1.4), sharex=True,
        gridspec_kw={"height_ratios": heights}, squeeze=False,
    )  # fmt: skip
    end = max(o.makespan for o in outcomes)
    keys = class_keys(outcomes)
    for ax, result in zip(axes[:n, 0], outcomes, strict=True):
        _gantt(ax, result, end)
    _in_use(axes[n, 0], outcomes, end)
    _waits(axes[n + 1, 0], outcomes, end)
    axes[n + 1, 0].set_xlim(0, end * 1.01)
    height = sum(heights) + 1.4
    fig.suptitle(title, y=1 - 0.12 / height, va="top")
    _class_legend(plt, fig, outcomes, keys, top=1 - 0.42 / height)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.62 / height))
    return fig


def _label(outcomes: Sequence[Outcome], key: ClassKey) -> str:
    return next(r.task.label for o in outcomes for r in o.runs if r.task.key == key)


def _class_legend(
    plt: Any, fig: Any, outcomes: Sequence[Outcome], keys: list[ClassKey], *, top: float
) -> None:
    """The demand classes and their colours, in one row under the title."""
    handles = [plt.Rectangle((0, 0), 1, 1, color=class_colour(key)) for key in keys]
    fig.legend(
        handles, [_label(outcomes, key) for key in keys], loc="upper center",
        bbox_to_anchor=(0.5, top), fontsize="small", ncol=min(len(keys), 10), frameon=False,
    )  # fmt: skip


def _gantt(ax: Any, result: Outcome, end: float) -> None:
    """Each GPU a lane; a task a bar as tall as its share, or binned occupancy when many."""
    collections = importlib.import_module("matplotlib.collections")
    bars = sum(len(run.gpus) for run in result.runs)
    verts = _bar_verts(result) if bars <= DETAIL_BARS else _band_verts(result, end)
    for key, polygons in sorted(verts.items()):
        edge = {"edgecolors": "white", "linewidths": 0.3} if bars <= DETAIL_BARS else {}
        ax.add_collection(
            collections.PolyCollection(polygons, facecolors=class_colour(key), **edge)
        )
    num_gpus = result.num_gpus
    if num_gpus <= 16:
        ax.set_yticks(range(num_gpus), [f"GPU {g}" for g in range(num_gpus)])
    ax.set_ylabel("GPU" if num_gpus > 16 else "")
    ax.set_ylim(num_gpus - 0.5, -0.5)
    ax.axvline(result.lower_bound, color="grey", linestyle=":", linewidth=1)
    binned = "" if bars <= DETAIL_BARS else f"; {len(result.runs):,} tasks, share per time bin"
    ax.set_title(
        f"{result.policy}: makespan {result.makespan:.1f} s "
        f"(lower bound {result.lower_bound:.1f} s, dotted{binned})", fontsize="medium", loc="left",
    )  # fmt: skip


Polygons = dict[ClassKey, list[Any]]  # class -> polygons, each a sequence of (x, y)


def _bar_verts(result: Outcome) -> Polygons:
    """One rectangle per task and GPU, stacked inside the lane where shares overlap."""
    verts: Polygons = {}
    for run, gpu, bottom in placed(result):
        low = gpu - LANE / 2 + bottom
        high = low + LANE * share(run)
        box = [(run.start, low), (run.start, high), (run.end, high), (run.end, low)]
        verts.setdefault(run.task.key, []).append(box)
    return verts


def _band_verts(result: Outcome, end: float) -> Polygons:
    """Per lane, one band per class: its mean share in each time bin, stacked in class order."""
    np = importlib.import_module("numpy")
    held = occupancy(result, end, BINS)
    xs = np.repeat(held.edges(), 2)[1:-1]  # each bin's two edges, for step curves
    outline = np.concatenate([xs, xs[::-1]])
    verts: Polygons = {}
    for gpu in range(result.num_gpus):
        level = np.full(BINS, gpu - LANE / 2)
        for k, key in enumerate(held.keys):
            top = level + LANE * held.shares[gpu, k]
            heights = np.concatenate([np.repeat(top, 2), np.repeat(level, 2)[::-1]])
            verts.setdefault(key, []).append(np.column_stack([outline, heights]))
            level = top
    return verts


def _in_use(ax: Any, outcomes: Sequence[Outcome], end: float) -> None:
    """GPUs in use over time, a line per policy (by line style), against the capacity."""
    for index, result in enumerate(outcomes):
        style = STYLES[index % len(STYLES)]
        if len(result.runs) <= DETAIL_BARS:
            times, used = usage_steps(result.runs)
            ax.step(times, used, where="post", color="black", linestyle=style, linewidth=1.1,
                    label=result.policy)  # fmt: skip
        else:
            edges, used = usage_bins(result.runs, end, BINS)
            ax.stairs(used, edges, color="black", linestyle=style, linewidth=1.1,
                      label=f"{result.policy} (mean per bin)")  # fmt: skip
    capacity = outcomes[0].num_gpus
    ax.axhline(capacity, color="grey", linewidth=0.8)
    ax.set_ylim(0, capacity * 1.1)
    ax.set_ylabel("GPUs in use")
    ax.legend(
        loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize="small", ncol=len(outcomes),
        frameon=False, handlelength=3,
    )  # fmt: skip


def _waits(ax: Any, outcomes: Sequence[Outcome], end: float) -> None:
    """Worst wait of the tasks arriving in each time bin: colour per class, style per policy."""
    for index, result in enumerate(outcomes):
        style, marker = STYLES[index % len(STYLES)], MARKERS[index % len(MARKERS)]
        times, worst = wait_bins(result.runs, end, WAIT_BINS)
        for key, waits in sorted(worst.items()):
            ax.plot(times, waits, color=class_colour(key), linestyle=style, linewidth=1,
                    marker=marker, markersize=2.5, fillstyle="none")  # fmt: skip
    ax.set_ylabel("worst wait (s)")
    ax.set_xlabel("arrival / time (s)")
    ax.set_ylim(bottom=0)
