"""The ``hwpool`` command: ``info``, ``demo``, ``simulate`` and ``bench``.

Exit status: 0 on success, 2 for bad usage or bad input (a one-line ``hwpool: error: ...`` on
stderr, no traceback), 1 when something the user could not have prevented fails (a benchmark
raised, no benchmarks to run), 130 when interrupted with Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .._check import int_from_text
from .._core._fairshare import DEFAULT_HALF_LIFE
from .._core._memory import format_mib
from .._sim import _simulate as _sim
from .._sim import _trace
from .._version import __version__
from . import _bench, _demo, _env, _host_cmds, _info, _jobs_cmds, _plot, _report, _run, _submit
from ._args import MAX_GPUS, gpu_memory_list
from ._progress import ProgressBar
from ._text import one_line, plural

__all__ = ["main"]


MAX_SECONDS = 3600.0
"""The longest ``demo --seconds`` accepts."""
PROGRESS_DELAY = 0.5
"""Seconds a simulation runs before its progress bar appears (on a terminal only)."""


class UserError(Exception):
    """A mistake in the command line or its input: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with the command's error contract: one line ``hwpool: error: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("hwpool").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"hwpool: error: {where}{one_line(message)} (see '{self.prog} --help')\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hwpool`` command with ``argv`` (default: ``sys.argv[1:]``); return its status."""
    args = _parser().parse_args(argv)
    try:
        _check_environment()
        status: int = args.run(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away is seen below
    except UserError as exc:
        print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except _bench.BenchError as exc:
        print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hwpool: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`hwpool ... | head`): not an error of ours
        _quiet_stdout()
        return 0
    return status


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the flush at exit, which would fail again on the
    closed pipe, writes nowhere (and Python prints no second error)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hwpool", description="Share one machine's GPUs and CPU cores; see what it does."
    )
    parser.add_argument("--version", action="version", version=f"hwpool {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="what hwpool detects on this machine, and from where")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument(
        "--file", action="append", default=[], metavar="PATH",
        help="also show which NUMA nodes hold PATH's cached pages (repeatable)",
    )  # fmt: skip
    info.set_defaults(run=_cmd_info)

    demo = commands.add_parser("demo", help="run a mixed workload through a real GPUPool")
    demo.add_argument(
        "--seconds", type=_seconds, default=_demo.DEMO_SECONDS, metavar="S",
        help=f"scale the workload to about S seconds (default {_demo.DEMO_SECONDS:g})",
    )  # fmt: skip
    demo.add_argument("--plot", metavar="FILE.png", help="also write a Gantt chart")
    demo.set_defaults(run=_cmd_demo)

    sim = commands.add_parser("simulate", help="replay a trace in virtual time")
    sim.add_argument(
        "trace", metavar="TRACE",
        help="a JSON Lines or CSV file (arrival, demand, duration[, name, owner, priority, "
        "limit]), "
        "or a bundled "
        f"example: {', '.join(_trace.EXAMPLE_TRACES)}",
    )  # fmt: skip
    sim.add_argument(
        "--gpus", type=_gpus, default=None, metavar="N",
        help=f"GPUs to simulate, 1 to {MAX_GPUS} (default 4)",
    )  # fmt: skip
    sim.add_argument(
        "--gpu-memory", type=gpu_memory_list, default=None, metavar="SIZE[,SIZE...]",
        help="GPUs sized in memory instead, e.g. 80GiB,24GiB (one per GPU; tasks may then "
        "ask for 'memory')",
    )  # fmt: skip
    sim.add_argument(
        "--policy", type=_policies, default=["hwpool"], metavar="P[,P...]",
        help=f"policies to compare: {', '.join(_sim.POLICIES)}, or 'all' (default hwpool)",
    )  # fmt: skip
    sim.add_argument(
        "--share", type=_share, action="append", default=[], metavar="OWNER=N",
        help="a trace owner's share of the machine (repeat per owner; default 1 each): the "
        "hwpool policies serve owners by recent usage over share",
    )  # fmt: skip
    sim.add_argument(
        "--half-life", type=_seconds, default=None, metavar="S",
        help="seconds after which an owner's past usage counts half (default 3600)",
    )  # fmt: skip
    sim.add_argument("--json", action="store_true", help="print one JSON object instead")
    sim.add_argument("--plot", metavar="FILE.png", help="also write Gantt and utilisation charts")
    sim.set_defaults(run=_cmd_simulate)

    bench = commands.add_parser("bench", help="run the benchmarks in bench/ and print their tables")
    bench.add_argument("names", nargs="*", metavar="NAME", help="only these (e.g. gpu_pool)")
    bench.add_argument("--dir", type=Path, metavar="DIR", help="the bench/ directory to use")
    bench.add_argument(
        "--quick", action="store_true", help="each benchmark's smallest setting (a smoke run)"
    )
    bench.set_defaults(run=_cmd_bench)
    _host_cmds.register(commands)
    _run.register(commands)
    _submit.register(commands)
    _jobs_cmds.register(commands)
    return parser


# ----------------------------------------------------------------- argument types
def _gpus(text: str) -> int:
    try:
        return int_from_text("--gpus", text, minimum=1, maximum=MAX_GPUS)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--gpus ")) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds > 0 and <= {MAX_SECONDS:g}, got {text[:40]!r}"
        )
    return value


def _share(text: str) -> tuple[str, float]:
    owner, sep, number = text.rpartition("=")
    try:
        share = float(number)
    except ValueError:
        share = math.nan
    if not sep or not owner or not (math.isfinite(share) and share > 0):
        raise argparse.ArgumentTypeError(
            f"must be OWNER=N with N a finite number > 0, got {text[:60]!r}"
        )
    return owner, share


def _policies(text: str) -> list[str]:
    names = list(_sim.POLICIES) if text == "all" else [p.strip() for p in text.split(",")]
    for name in names:
        if name not in _sim.POLICIES:
            raise argparse.ArgumentTypeError(
                f"unknown policy {name!r}; choose from {', '.join(_sim.POLICIES)} or 'all'"
            )
    return list(dict.fromkeys(names))


# ----------------------------------------------------------------- commands
def _check_environment() -> None:
    """Every HWPOOL_* variable, parsed before any command does any work."""
    try:
        _env.check_environment(os.environ)
    except ValueError as exc:  # the message names the variable and its value
        raise UserError(str(exc)) from None


def _cmd_info(args: argparse.Namespace) -> int:
    try:
        info = _info.gather(args.file)
    except ValueError as exc:  # a malformed environment variable, named in the message
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"--file: cannot read {exc.filename!r}: {exc.strerror}") from None
    print(json.dumps(info, indent=2, allow_nan=False) if args.json else _info.format_info(info))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    if args.plot is not None:
        _check_plot_target(args.plot)
    sizes = args.gpu_memory
    if sizes is not None and args.gpus is not None:
        raise UserError("give --gpus or --gpu-memory, not both (--gpu-memory counts the GPUs)")
    num_gpus = len(sizes) if sizes is not None else args.gpus or 4
    try:
        tasks = _trace.load_trace(args.trace, max_gpus=num_gpus)
        fair = _sim.FairShare(dict(args.share), args.half_life or DEFAULT_HALF_LIFE)
        outcomes = _simulate_all(tasks, num_gpus, args.policy, sizes, fair)
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


def _simulate_all(
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


def _cmd_demo(args: argparse.Namespace) -> int:
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


def _cmd_bench(args: argparse.Namespace) -> int:
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
