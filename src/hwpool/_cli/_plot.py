"""Charts of schedules: a Gantt chart per policy and GPUs in use over time (needs matplotlib).

matplotlib is the optional ``plot`` extra; it is imported only when a chart is asked for, and
:func:`require_matplotlib` turns its absence into one clear message.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from .._core._capacity import UNITS_PER_GPU
from .._sim._simulate import Outcome, TaskRun

__all__ = ["INSTALL_HINT", "PlotUnavailableError", "plot_outcomes", "require_matplotlib"]

INSTALL_HINT = "plotting needs matplotlib: pip install 'hwpool[plot]'"
LANE = 0.8  # height of one GPU's lane in the Gantt chart


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


def plot_outcomes(outcomes: Sequence[Outcome], path: str, title: str) -> None:
    """Write one PNG: a Gantt chart per outcome, then GPUs in use over time for all of them."""
    plt = require_matplotlib()
    n = len(outcomes)
    num_gpus = outcomes[0].num_gpus
    heights = [max(1.6, 0.45 * num_gpus)] * n + [2.4]
    fig, axes = plt.subplots(
        n + 1, 1, figsize=(11, sum(heights) + 1), sharex=True,
        gridspec_kw={"height_ratios": heights}, squeeze=False,
    )  # fmt: skip
    labels = sorted({r.task.label for r in outcomes[0].runs}, key=_label_order(outcomes[0].runs))
    colours = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(labels)}
    for ax, result in zip(axes[:n, 0], outcomes, strict=True):
        _gantt(ax, result, colours)
    _in_use(axes[n, 0], outcomes)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[label]) for label in labels]
    axes[0, 0].legend(
        handles, labels, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize="small",
        ncol=len(labels), frameon=False,
    )  # fmt: skip
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _label_order(runs: Sequence[TaskRun]) -> Any:
    order = {r.task.label: (r.task.count, r.task.units) for r in runs}
    return lambda label: order[label]


def _gantt(ax: Any, result: Outcome, colours: dict[str, Any]) -> None:
    """Each GPU a lane; a task is a bar as tall as its share, stacked where shares overlap."""
    for run, gpu, bottom in _placed(result):
        height = LANE * run.task.units / UNITS_PER_GPU
        ax.broken_barh(
            [(run.start, run.end - run.start)], (gpu - LANE / 2 + bottom, height),
            facecolors=colours[run.task.label], edgecolors="white", linewidth=0.3,
        )  # fmt: skip
    ax.set_yticks(range(result.num_gpus), [f"GPU {g}" for g in range(result.num_gpus)])
    ax.set_ylim(result.num_gpus - 0.5, -0.5)
    ax.axvline(result.lower_bound, color="black", linestyle=":", linewidth=1)
    ax.set_title(
        f"{result.policy}: makespan {result.makespan:.1f} s "
        f"(lower bound {result.lower_bound:.1f} s, dotted)", fontsize="medium", loc="left",
    )  # fmt: skip


def _placed(result: Outcome) -> list[tuple[TaskRun, int, float]]:
    """(run, gpu, vertical offset): the lowest offset free of the runs active at its start."""
    placed: list[tuple[TaskRun, int, float]] = []
    active: dict[int, list[tuple[float, float, float]]] = {}  # gpu -> (end, bottom, top)
    for run in sorted(result.runs, key=lambda r: (r.start, r.task.arrival)):
        height = LANE * run.task.units / UNITS_PER_GPU
        for gpu in run.gpus:
            live = sorted((b, t) for end, b, t in active.get(gpu, []) if end > run.start)
            bottom = 0.0
            for low, high in live:
                if bottom + height <= low + 1e-9:
                    break
                bottom = max(bottom, high)
            bottom = min(bottom, LANE - height)
            kept = [span for span in active.get(gpu, []) if span[0] > run.start]
            active[gpu] = [*kept, (run.end, bottom, bottom + height)]
            placed.append((run, gpu, bottom))
    return placed


def _in_use(ax: Any, outcomes: Sequence[Outcome]) -> None:
    """GPUs in use over time (a step line per policy) against the capacity."""
    for result in outcomes:
        times, used = _usage_steps(result.runs)
        ax.step(times, used, where="post", label=result.policy, linewidth=1.2)
    ax.axhline(outcomes[0].num_gpus, color="grey", linestyle="--", linewidth=1)
    ax.set_ylim(0, outcomes[0].num_gpus * 1.08)
    ax.set_ylabel("GPUs in use")
    ax.set_xlabel("time (s)")
    ax.legend(loc="lower right", fontsize="small", ncol=len(outcomes))


def _usage_steps(runs: Sequence[TaskRun]) -> tuple[list[float], list[float]]:
    changes: dict[float, float] = {}
    for run in runs:
        amount = run.task.count * run.task.units / UNITS_PER_GPU
        changes[run.start] = changes.get(run.start, 0.0) + amount
        changes[run.end] = changes.get(run.end, 0.0) - amount
    times, used, level = [], [], 0.0
    for time in sorted(changes):
        level += changes[time]
        times.append(time)
        used.append(max(0.0, level))
    return times, used
