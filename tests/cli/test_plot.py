"""Charts: bars stacked without overlap, one collection per class, binning, colours and styles."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from hwpool._cli._plot import figure, plot_outcomes
from hwpool._cli._plot_data import (
    DETAIL_BARS,
    LANE,
    bin_intervals,
    class_colour,
    placed,
    usage_steps,
    wait_bins,
)
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._sim._simulate import Outcome, TaskRun, outcome, simulate
from hwpool._sim._trace import Task, load_trace

np = pytest.importorskip("numpy")
plt = pytest.importorskip("matplotlib.pyplot")


def test_concurrent_shares_of_one_gpu_do_not_overlap() -> None:
    result = simulate(load_trace("embedding"), 2)
    bars = placed(result)
    assert len(bars) == sum(len(run.gpus) for run in result.runs)
    for i, (run, gpu, bottom) in enumerate(bars):
        top = bottom + LANE * run.task.units / UNITS_PER_GPU
        assert bottom >= -1e-9 and top <= LANE + 1e-9
        for other, other_gpu, other_bottom in bars[i + 1 : i + 40]:
            if other_gpu != gpu or other.start >= run.end or run.start >= other.end:
                continue
            other_top = other_bottom + LANE * other.task.units / UNITS_PER_GPU
            overlap = min(top, other_top) - max(bottom, other_bottom)
            # Fragmentation can force an overlap only when the lane has no gap tall enough.
            clamped = abs(other_top - LANE) < 1e-9  # the later bar was pushed down to fit
            assert overlap <= 1e-9 or clamped


def test_usage_steps_never_exceed_the_gpus() -> None:
    result = simulate(load_trace("batch"), 4, "first-fit")
    times, used = usage_steps(result.runs)
    assert times == sorted(times)
    assert max(used) <= 4 + 1e-9
    assert used[-1] == pytest.approx(0.0, abs=1e-9)


def test_bin_intervals_matches_the_overlap_of_each_interval_with_each_bin() -> None:
    rng = random.Random(3)
    bins, groups = 12, 3
    spans = [(rng.uniform(-1, 13), rng.uniform(0, 4), rng.random(), rng.randrange(groups))]
    spans += [(rng.choice((0.0, 2.0, 11.5)), rng.choice((0.0, 0.5, 1.0, 3.0)), 1.0, 0)] * 5
    spans += [(rng.uniform(0, 12), rng.uniform(0, 6), rng.random(), rng.randrange(groups))] * 50
    begin = np.array([b for b, _, _, _ in spans])
    end = begin + np.array([length for _, length, _, _ in spans])
    weight = np.array([w for _, _, w, _ in spans])
    group = np.array([g for _, _, _, g in spans])
    got = bin_intervals(begin, end, weight, group, groups=groups, bins=bins)
    want = np.zeros((groups, bins))
    for b, e, w, g in zip(begin, end, weight, group, strict=True):
        for slot in range(bins):
            want[g, slot] += w * max(0.0, min(e, slot + 1) - max(b, slot))
    assert np.allclose(got, want)


def _outcome(n: int, classes: list[tuple[int, int]], num_gpus: int = 4) -> Outcome:
    rng = random.Random(n)
    tasks = []
    for i in range(n):
        count, units = rng.choice(classes)
        tasks.append(Task(f"t{i}", i * 0.05, count, units, rng.uniform(0.1, 2.0)))
    return simulate(tasks, num_gpus)


def test_waits_are_binned_by_arrival_with_gaps_left_empty() -> None:
    runs = [
        TaskRun(Task("a", 0.5, 1, UNITS_PER_GPU, 1.0), 2.0, 3.0, (0,)),
        TaskRun(Task("b", 0.7, 1, UNITS_PER_GPU, 1.0), 1.0, 2.0, (0,)),
        TaskRun(Task("c", 9.5, 1, UNITS_PER_GPU, 1.0), 9.5, 10.5, (0,)),
    ]
    middles, worst = wait_bins(runs, 10.0, 10)
    assert list(middles) == [i + 0.5 for i in range(10)]
    waits = worst[(1, UNITS_PER_GPU, 0)]
    assert waits[0] == 1.5  # the worst of a (1.5 s) and b (0.3 s)
    assert waits[9] == 0.0
    assert all(math.isnan(w) for w in waits[1:9])


def test_colours_belong_to_the_class_not_to_its_rank_in_the_chart() -> None:
    # Before, a class took the colour of its rank among the classes present: 0.25 GPU was the
    # third colour in the demo (0.1, 0.2, 0.25, ...) and the first in the batch trace.
    quarter = (1, UNITS_PER_GPU // 4, 0)
    assert class_colour(quarter) == "#2ca02c"  # green, as in every chart
    common = [(1, UNITS_PER_GPU // d, 0) for d in (10, 5, 4, 2, 1)]
    common += [(2, UNITS_PER_GPU, 0), (4, UNITS_PER_GPU, 0)]
    assert len({class_colour(key) for key in common}) == len(common)
    assert class_colour((1, 123_456, 0)) == class_colour((1, 123_456, 0))  # others: stable too


def _figure_colours(result: Outcome) -> dict[tuple[int, int, int], tuple[float, ...]]:
    fig = figure([result], "t")
    try:
        gantt = fig.axes[0]
        keys = sorted({r.task.key for r in result.runs})
        assert len(gantt.collections) == len(keys)  # one collection per class, not per task
        return {
            key: tuple(c.get_facecolor()[0]) for key, c in zip(keys, gantt.collections, strict=True)
        }
    finally:
        plt.close(fig)


@pytest.mark.parametrize("n", [40, DETAIL_BARS + 500])
def test_one_collection_per_class_in_detail_and_in_binned_charts(n: int) -> None:
    small = _figure_colours(_outcome(n, [(1, 100_000), (1, 250_000), (2, UNITS_PER_GPU)]))
    other = _figure_colours(_outcome(n, [(1, 250_000), (1, 500_000)]))
    assert small[(1, 250_000, 0)] == other[(1, 250_000, 0)]


def test_policies_differ_by_line_style_and_classes_keep_their_colour() -> None:
    trace = load_trace("batch")
    fig = figure([simulate(trace, 4), simulate(trace, 4, "first-fit")], "t")
    try:
        in_use, waits = fig.axes[2], fig.axes[3]
        lines = [line for line in in_use.get_lines() if line.get_label() in ("hwpool", "first-fit")]
        assert len({line.get_linestyle() for line in lines}) == 2
        assert len({line.get_color() for line in lines}) == 1
        by_colour: dict[str, set[str]] = {}
        for line in waits.get_lines():
            by_colour.setdefault(str(line.get_color()), set()).add(line.get_linestyle())
        assert len(by_colour) == 4  # the four classes of the batch trace
        assert all(len(styles) == 2 for styles in by_colour.values())
    finally:
        plt.close(fig)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    out = tmp_path / "c.png"
    trace = load_trace("batch")
    plot_outcomes([simulate(trace, 4), simulate(trace, 4, "fifo")], str(out), "t")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_measured_outcomes_plot_too(tmp_path: Path) -> None:
    runs = [TaskRun(Task("x", 0.0, 1, UNITS_PER_GPU // 2, 1.0), 0.1, 1.1, (0,))]
    plot_outcomes([outcome("measured", 1, runs)], str(tmp_path / "m.svg"), "t")
    assert (tmp_path / "m.svg").read_text().lstrip().startswith("<?xml")
