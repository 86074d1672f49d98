"""Charts: bars stacked without overlap inside a GPU's lane, and a PNG written."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwpool._cli._plot import LANE, _placed, _usage_steps, plot_outcomes
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._sim._simulate import simulate
from hwpool._sim._trace import load_trace


def test_concurrent_shares_of_one_gpu_do_not_overlap() -> None:
    result = simulate(load_trace("embedding"), 2)
    placed = _placed(result)
    assert len(placed) == sum(len(run.gpus) for run in result.runs)
    for i, (run, gpu, bottom) in enumerate(placed):
        top = bottom + LANE * run.task.units / UNITS_PER_GPU
        assert bottom >= -1e-9 and top <= LANE + 1e-9
        for other, other_gpu, other_bottom in placed[i + 1 : i + 40]:
            if other_gpu != gpu or other.start >= run.end or run.start >= other.end:
                continue
            other_top = other_bottom + LANE * other.task.units / UNITS_PER_GPU
            overlap = min(top, other_top) - max(bottom, other_bottom)
            # Fragmentation can force an overlap only when the lane has no gap tall enough.
            clamped = abs(other_top - LANE) < 1e-9  # the later bar was pushed down to fit
            assert overlap <= 1e-9 or clamped


def test_usage_steps_never_exceed_the_gpus() -> None:
    result = simulate(load_trace("batch"), 4, "first-fit")
    times, used = _usage_steps(result.runs)
    assert times == sorted(times)
    assert max(used) <= 4 + 1e-9
    assert used[-1] == pytest.approx(0.0, abs=1e-9)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "c.png"
    trace = load_trace("batch")
    plot_outcomes([simulate(trace, 4), simulate(trace, 4, "fifo")], str(out), "t")
    assert out.read_bytes()[:4] == b"\x89PNG"
