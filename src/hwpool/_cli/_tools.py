"""``hwpool info``, ``demo``, ``simulate`` and ``bench``: the commands that need no server.

Each raises :class:`UserError` for bad input (``main`` reports it in one line, exit 2);
``bench`` exits 1 when a benchmark failed (or there is none to run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._memory import format_mib
from .._sim import _simulate as _sim
from .._sim import _trace
from . import _bench, _demo, _info, _plot, _report
from ._args import UserError
from ._progress import ProgressBar
from ._text import one_line, plural

__all__ = ["PROGRESS_DELAY", "cmd_bench", "cmd_demo", "cmd_info", "cmd_simulate", "simulate_all"]

PROGRESS_DELAY = 0.5
"""Seconds a simulation runs before its progress bar appears (on a terminal only)."""


def cmd_info(args: argparse.Namespace) -> int:
    try:
        info = _info.gather(args.file)
    except ValueError as exc:  # a malformed environment variable, named in the message
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"--file: cannot read {exc.filename!r}: {exc.strerror}") from None
    print(json.dumps(info, indent=2, allow_nan=False) if args.json else _info.format_info(info))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.plot is not None:
        _check_plot_target(args.plot)
    sizes = args.gpu_memory
    if sizes is not None and args.gpus is not None:
        raise UserError("give --gpus or --gpu-memory, not both (--gpu-memory counts the GPUs)")
    num_gpus = len(sizes) if sizes is not None else args.gpus or 4
    try:
        tasks = _trace.load_trace(args.trace, max_gpus=num_gpus)
        fair = _sim.FairShare(dict(args.share), args.half_life or DEFAULT_HALF_LIFE)
        outcomes = simulate_all(tasks, num_gpus, args.policy, sizes, fair)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    machine = plural(num_gpus, "GPU")
    if sizes is not None:
        machine += f" ({' + '.join(format_mib(size) for size in sizes)})"
    if args.plot is not None:
        _write_plot(outcomes, args.plot, f"{args.trace} on {machine}")
    if args.json:
        print(json.dumps(_report.outcomes_json(outcomes), indent=1, allow_nan=False))
    else:
        print(f"{args.trace}: {plural(len(tasks), 'task')} on {machine} (virtual time)")
        print(_report.format_table(outcomes))
    return 0


def simulate_all(
    tasks: Sequence[_trace.Task],
    num_gpus: int,
    policies: Sequence[str],
    gpu_memory: Sequence[int] | None = None,
    fair: _sim.FairShare | None = None,
) -> list[_sim.Outcome]:
    """Each policy in turn, with a progress bar on a terminal once it takes over half a second;
    ``fair``: the owners' shares and the half-life for the hwpool policies."""
    fair = fair or _sim.FairShare()
    total = len(tasks) * len(policies)
    bar = ProgressBar(total, "tasks simulated", sys.stderr, delay=PROGRESS_DELAY)
    outcomes = []
    for index, policy in enumerate(policies):
        base = index * len(tasks)

        def advance(done: int, base: int = base) -> None:
            bar.advance(base + done - bar.done)

        outcomes.append(
            _sim.simulate(
                tasks,
                num_gpus,
                policy,
                progress=advance,
                gpu_memory=gpu_memory,
                shares=fair.shares,
                half_life=fair.half_life,
            )
        )
        advance(len(tasks))
    bar.close()
    return outcomes


def cmd_demo(args: argparse.Namespace) -> int:
    if args.plot is not None:
        _check_plot_target(args.plot)
    tasks = _demo.demo_workload(args.seconds)
    num_gpus = _demo.DEMO_GPUS
    gpus = plural(num_gpus, "logical GPU")
    print(f"GPU stage: {plural(len(tasks), 'call')} on a GPUPool of {gpus}, real time")
    sys.stdout.flush()
    bar = ProgressBar(len(tasks), "calls done", sys.stderr)
    runs = _demo.run_gpu_stage(tasks, num_gpus, bar.advance)
    bar.close()
    measured = _sim.outcome("GPUPool (measured)", num_gpus, runs)
    predicted = dataclasses.replace(_sim.simulate(tasks, num_gpus), policy="simulated")
    if args.plot is not None:
        _write_plot([measured], args.plot, f"hwpool demo: {num_gpus} GPUs, real time")
    print(_report.format_table([measured, predicted]))
    _demo_cpu_stage(max(4, round(16 * args.seconds)))
    return 0


def _demo_cpu_stage(rows: int) -> None:
    what = plural(rows, "row")
    print(f"\nCPU stage: {what} of hashing (4 MiB each), serial, then on CPUPool.from_env()")
    sys.stdout.flush()
    stage = _demo.run_cpu_stage(rows)
    print(
        f"  serial {stage.serial_s:.2f} s; team of {plural(stage.team, 'thread')} "
        f"{stage.pool_s:.2f} s: speed-up {stage.speedup:.2f}x over serial"
    )


def _bench_all(args: argparse.Namespace) -> int:
    """Run each chosen benchmark under a ``== NAME ==`` heading; one that fails is reported
    on stderr and the others still run; exit status 1 if any failed."""
    directory = args.dir if args.dir is not None else _bench.find_bench_dir()
    scripts = _bench.find_scripts(directory, args.names)
    failed: list[str] = []
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        print(f"== {name} ==")
        sys.stdout.flush()
        try:
            table = _bench.run_one(script, quick=args.quick)
        except _bench.BenchError as exc:
            print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
            failed.append(name)
            continue
        print(table)
        sys.stdout.flush()
    if failed:
        raise _bench.BenchError(
            f"{len(failed)} of {plural(len(scripts), 'benchmark')} failed: {', '.join(failed)}"
        )
    return 0


# ----------------------------------------------------------------- plotting
def _check_plot_target(path: str) -> None:
    """Fail before any work if the chart cannot be written: no matplotlib, a format matplotlib
    does not write (or no extension to name one), no such folder, a folder not writable."""
    try:
        _plot.require_matplotlib()
    except _plot.PlotUnavailableError as exc:
        raise UserError(f"--plot: {exc}") from None
    if Path(path).is_dir():
        raise UserError(f"--plot: {path!r} is a directory; give a file name such as chart.png")
    try:
        _plot.check_format(path)
    except ValueError as exc:
        raise UserError(f"--plot: {exc}") from None
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UserError(f"--plot: no such directory {str(parent)!r} for {path!r}")
    if not os.access(parent, os.W_OK):
        raise UserError(f"--plot: cannot write into {str(parent)!r}")


def _write_plot(outcomes: Sequence[_sim.Outcome], path: str, title: str) -> None:
    try:
        _plot.plot_outcomes(outcomes, path, title)
    except (OSError, ValueError, RuntimeError) as exc:
        raise UserError(f"--plot: cannot write {path!r}: {exc}") from None
    print(f"wrote {path}", file=sys.stderr)


def cmd_bench(args: argparse.Namespace) -> int:
    """``hwpool bench``: 0, or 1 (in one line on stderr) when a benchmark failed."""
    try:
        return _bench_all(args)
    except _bench.BenchError as exc:
        print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
