"""The ``hwpool`` command line: every subcommand, its options and their help.

The parser is built before every command, so it must be cheap: this module imports only the
argument types (``_args``) and the few constants the help names, from modules that hold
nothing else. Each command's implementation, and all it uses (the GPU pool, the server, the
job table...), is imported by the command's function at the end of this module, when that
command runs (see tests/cli/test_startup.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .. import _exits
from .._core._policies import POLICIES as SERVER_POLICIES
from .._server._defaults import (
    DEFAULT_CONFIG,
    MAX_REQUESTS_PER_CONNECTION,
    MAX_REQUESTS_PER_USER,
    METRICS_MAX_CONNECTIONS,
    METRICS_TIMEOUT_S,
)
from .._sim._names import EXAMPLE_TRACES
from .._sim._names import POLICIES as SIMULATED_POLICIES
from .._version import __version__
from .._wire._bounds import MAX_PRIORITY
from . import _args
from ._args import DEMO_SECONDS, JOB_ID_NOTE, MAX_GPUS, WAIT_TIMED_OUT
from ._text import one_line

__all__ = ["RUN_GRACE_S", "build"]

RUN_GRACE_S = 5.0
"""``hwpool run --grace``'s default."""

Subcommands = Any  # argparse's _SubParsersAction, which it does not name publicly


class _Parser(argparse.ArgumentParser):
    """argparse with the command's error contract: one line ``hwpool: error: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("hwpool").strip()
        where = f"{command}: " if command else ""
        self.exit(2, f"hwpool: error: {where}{one_line(message)} (see '{self.prog} --help')\n")


def build() -> argparse.ArgumentParser:
    """The ``hwpool`` parser; each subcommand sets ``run``, its function."""
    parser = _Parser(
        prog="hwpool", description="Share one machine's GPUs and CPU cores; see what it does."
    )
    parser.add_argument("--version", action="version", version=f"hwpool {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    _add_tools(commands)
    _add_host(commands)
    _add_run(commands)
    _add_submit(commands)
    _add_jobs(commands)
    return parser


# ----------------------------------------------------------------- info, demo, simulate, bench
def _add_tools(commands: Subcommands) -> None:
    info = commands.add_parser("info", help="what hwpool detects on this machine, and from where")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument(
        "--file", action="append", default=[], metavar="PATH",
        help="also show which NUMA nodes hold PATH's cached pages (repeatable)",
    )  # fmt: skip
    info.set_defaults(run=_info)

    demo = commands.add_parser("demo", help="run a mixed workload through a real GPUPool")
    demo.add_argument(
        "--seconds", type=_args.seconds_within_an_hour, default=DEMO_SECONDS, metavar="S",
        help=f"scale the workload to about S seconds (default {DEMO_SECONDS:g})",
    )  # fmt: skip
    demo.add_argument("--plot", metavar="FILE.png", help="also write a Gantt chart")
    demo.set_defaults(run=_demo)

    sim = commands.add_parser("simulate", help="replay a trace in virtual time")
    sim.add_argument(
        "trace", metavar="TRACE",
        help="a JSON Lines or CSV file (arrival, demand, duration[, name, owner, priority, "
        "limit]), "
        "or a bundled "
        f"example: {', '.join(EXAMPLE_TRACES)}",
    )  # fmt: skip
    sim.add_argument(
        "--gpus", type=_args.gpu_count, default=None, metavar="N",
        help=f"GPUs to simulate, 1 to {MAX_GPUS} (default 4)",
    )  # fmt: skip
    sim.add_argument(
        "--gpu-memory", type=_args.gpu_memory_list, default=None, metavar="SIZE[,SIZE...]",
        help="GPUs sized in memory instead, e.g. 80GiB,24GiB (one per GPU; tasks may then "
        "ask for 'memory')",
    )  # fmt: skip
    sim.add_argument(
        "--policy", type=_args.policies, default=["hwpool"], metavar="P[,P...]",
        help=f"policies to compare: {', '.join(SIMULATED_POLICIES)}, or 'all' (default hwpool)",
    )  # fmt: skip
    sim.add_argument(
        "--share", type=_args.share, action="append", default=[], metavar="OWNER=N",
        help="a trace owner's share of the machine (repeat per owner; default 1 each): the "
        "hwpool policies serve owners by recent usage over share",
    )  # fmt: skip
    sim.add_argument(
        "--half-life", type=_args.seconds_within_an_hour, default=None, metavar="S",
        help="seconds after which an owner's past usage counts half (default 3600)",
    )  # fmt: skip
    sim.add_argument("--json", action="store_true", help="print one JSON object instead")
    sim.add_argument("--plot", metavar="FILE.png", help="also write Gantt and utilisation charts")
    sim.set_defaults(run=_simulate)

    bench = commands.add_parser("bench", help="run the benchmarks in bench/ and print their tables")
    bench.add_argument("names", nargs="*", metavar="NAME", help="only these (e.g. gpu_pool)")
    bench.add_argument("--dir", type=Path, metavar="DIR", help="the bench/ directory to use")
    bench.add_argument(
        "--quick", action="store_true", help="each benchmark's smallest setting (a smoke run)"
    )
    bench.set_defaults(run=_bench)


# ----------------------------------------------------------------- serve, status, cancel
def _add_host(commands: Subcommands) -> None:
    srv = commands.add_parser("serve", help="share this host's GPUs among all its processes")
    _socket_option(srv)
    srv.add_argument(
        "--gpus", type=_args.count, metavar="N", help="N logical GPUs (default: detect)"
    )
    srv.add_argument(
        "--memory", action="store_true",
        help="share each detected GPU by its memory, so requests may ask for MiB "
        "(`hwpool run --mem 6GiB`); a fraction is then that share of the GPU it lands on",
    )  # fmt: skip
    srv.add_argument(
        "--gpu-memory", type=_args.gpu_memory_list, metavar="SIZE[,SIZE...]",
        help="logical GPUs of these memory sizes, e.g. 80GiB,24GiB (as --memory, without "
        "detection)",
    )  # fmt: skip
    srv.add_argument(
        "--reserve-in-use", action="store_true",
        help="with --memory: leave alone the memory other processes use on each GPU when the "
        "server starts (each GPU's share is its total less that)",
    )  # fmt: skip
    srv.add_argument(
        "--group", metavar="NAME",
        help="also serve the members of group NAME (directory 0770, socket 0660)",
    )  # fmt: skip
    srv.add_argument(
        "--admin-group", metavar="NAME",
        help="the members of group NAME (as it is when the server starts) may cancel anyone's "
        "requests and drain the server, as root and the server's own user may",
    )  # fmt: skip
    srv.add_argument(
        "--grace", type=_args.positive_seconds, metavar="S",
        help="after a restart, grant nothing new for up to S s while clients reclaim (default 5)",
    )  # fmt: skip
    srv.add_argument(
        "--max-connections", type=_args.count, metavar="N",
        help="connections allowed per uid (default 64); `hwpool status` and `hwpool cancel` "
        "connect beyond them, on up to --max-control-connections more",
    )  # fmt: skip
    srv.add_argument(
        "--max-control-connections", type=_args.count, metavar="N",
        help="connections per uid for status and cancel only, beyond --max-connections "
        "(default 8)",
    )  # fmt: skip
    srv.add_argument(
        "--max-requests-per-connection", type=_args.count, metavar="N",
        help="leases and waiters one connection may have at once (default "
        f"{MAX_REQUESTS_PER_CONNECTION}); past it an acquire gets an error",
    )  # fmt: skip
    srv.add_argument(
        "--max-requests-per-user", type=_args.count, metavar="N",
        help="leases and waiters one uid may have at once, over all its connections "
        f"(default {MAX_REQUESTS_PER_USER})",
    )  # fmt: skip
    srv.add_argument(
        "--hello-timeout", type=_args.positive_seconds, metavar="S",
        help="close a connection that sends no hello, or half a message, for S s (default 10)",
    )  # fmt: skip
    srv.add_argument(
        "--idle-timeout", type=_args.positive_seconds, metavar="S",
        help="stop after S s with no client connected (default: never; `hwpool run` starts "
        "its servers with 600)",
    )  # fmt: skip
    srv.add_argument(
        "--watch-interval", type=_args.seconds_or_off, metavar="S",
        help="sample the GPUs' memory, utilisation and processes every S s (default 2; 0 or "
        "off: never; off anyway for logical GPUs without UUIDs, as with --gpus)",
    )  # fmt: skip
    srv.add_argument(
        "--over-lease", choices=("warn", "term", "off"),
        help="a lease using more GPU memory than it was leased: warn (default: the log and "
        "the job's stderr say so), term (also SIGTERM its process group after "
        "--over-lease-grace and end the lease), off (only flagged in status)",
    )  # fmt: skip
    srv.add_argument(
        "--over-lease-grace", type=_args.seconds_or_zero, metavar="S",
        help="with --over-lease term: how long a lease may stay over before it is ended "
        "(default 30)",
    )  # fmt: skip
    srv.add_argument(
        "--policy", choices=SERVER_POLICIES,
        help="the scheduling policy (default easy; reserve-all: the one hwpool started from)",
    )  # fmt: skip
    srv.add_argument(
        "--metrics-port", type=_args.port, metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (0: any free port, said in "
        "the log); needs prometheus-client (pip install 'hwpool[metrics]')",
    )  # fmt: skip
    srv.add_argument(
        "--metrics-host", metavar="HOST",
        help="the address the metrics listen on (default 127.0.0.1: this machine only)",
    )  # fmt: skip
    srv.add_argument(
        "--metrics-max-connections", type=_args.count, metavar="N",
        help=f"connections open at once to the metrics port (default {METRICS_MAX_CONNECTIONS}"
        "); one past them is closed at once",
    )  # fmt: skip
    srv.add_argument(
        "--metrics-timeout", type=_args.positive_seconds, metavar="S",
        help="close a metrics connection that sends no whole request, or does not take the "
        f"answer, within S s (default {METRICS_TIMEOUT_S:g})",
    )  # fmt: skip
    srv.add_argument(
        "--config", type=Path, metavar="PATH",
        help=f"read settings from this TOML file (default: $HWPOOL_CONFIG, else {DEFAULT_CONFIG}, "
        "if it exists and the server listens on the machine-wide socket); flags override it",
    )  # fmt: skip
    srv.add_argument(
        "--check-config", action="store_true",
        help="check the config file and print the settings the server would run with; exit "
        "0 if they are good, 2 if not (nothing is started)",
    )  # fmt: skip
    srv.set_defaults(run=_serve)

    status = commands.add_parser("status", help="the host-wide queue: GPUs, leases, waiters")
    _socket_option(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of text")
    status.set_defaults(run=_status)

    top = commands.add_parser(
        "top", help="the host-wide queue live: GPU bars, leases, waiters and why they wait",
        description="A full-screen view of the host server, redrawn every --interval seconds "
        "(q quits). When stdout is not a terminal it prints one snapshot per interval.",
    )  # fmt: skip
    _socket_option(top)
    top.add_argument(
        "--interval", type=_args.positive_seconds, default=2.0, metavar="S",
        help="seconds between refreshes (default 2)",
    )  # fmt: skip
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.set_defaults(run=_top)

    cancel = commands.add_parser(
        "cancel",
        help="cancel jobs (j12), withdraw waiters or revoke leases (12): by id, by name, or "
        "all of yours",
        description="Cancel each ID: a job id such as j12 (`hwpool jobs`: a queued job is "
        "withdrawn, a running one ended, SIGTERM then SIGKILL after a grace) or a host "
        "server's request id such as 12 (`hwpool status` shows #12: the waiter is withdrawn, "
        "the lease revoked). --name and --mine select server requests.",
    )  # fmt: skip
    cancel.add_argument(
        "ids", type=_args.cancel_id, nargs="*", metavar="ID",
        help="a job id (j12, as `hwpool jobs` shows) or a server request id (12, as "
        "`hwpool status` shows #12)",
    )  # fmt: skip
    cancel.add_argument(
        "--name", metavar="NAME",
        help="also every request named NAME that you may cancel (yours; an admin's: anyone's)",
    )  # fmt: skip
    cancel.add_argument(
        "--mine", action="store_true",
        help="also every request of yours (with --name: those of yours named NAME)",
    )  # fmt: skip
    cancel.add_argument(
        "--user", metavar="NAME",
        help="the job ids are user NAME's (root or an admin of the server only): root "
        "cancels them as NAME in NAME's table; an admin through the server, by their labels. "
        "With no ids: all of NAME's jobs that have not finished",
    )  # fmt: skip
    cancel.add_argument(
        "--state", type=_args.job_states, metavar="STATE[,STATE...]",
        help="with --user and no ids: only NAME's jobs in these states (queued, held, "
        "running, ...)",
    )  # fmt: skip
    _socket_option(cancel)
    cancel.set_defaults(run=_cancel)
    _add_drain(commands)


def _add_drain(commands: Subcommands) -> None:
    drain = commands.add_parser(
        "drain", help="take the server, or some of its GPUs, out of service (admins)",
        description="Drain the whole server, or each --gpu: nothing new is granted there; "
        "leases already held run to their end; waiters stay queued and say why they wait. "
        "The drain survives a restart of the server. Root or the server's admin group only.",
    )  # fmt: skip
    resume = commands.add_parser(
        "resume", help="put a drained server or GPUs back in service (admins)",
        description="End the drain of the whole server (and of every GPU), or of each --gpu: "
        "waiters are granted there again. Root or the server's admin group only.",
    )  # fmt: skip
    for parser, verb in ((drain, "drain"), (resume, "resume")):
        parser.add_argument(
            "--gpu", type=_args.gpu_index, action="append", metavar="INDEX",
            help=f"{verb} GPU INDEX only, as `hwpool status` numbers them (repeatable; "
            "default: the whole server)",
        )  # fmt: skip
        _socket_option(parser)
    drain.add_argument(
        "--reason", type=_args.drain_reason, metavar="TEXT",
        help="why, shown by `hwpool status` and beside every waiter (`draining: TEXT`)",
    )  # fmt: skip
    drain.set_defaults(run=_drain)
    resume.set_defaults(run=_resume)


def _socket_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket", metavar="PATH",
        help="the server's socket (default: $HWPOOL_SOCKET, else "
        "$XDG_RUNTIME_DIR/hwpool/hwpool.sock, else /tmp/hwpool-UID/hwpool.sock; status and "
        "cancel look for the machine-wide server first: $HWPOOL_SYSTEM_SOCKET, else "
        "/run/hwpool/hwpool.sock)",
    )  # fmt: skip


# ----------------------------------------------------------------- run
def _add_run(commands: Subcommands) -> None:
    run = commands.add_parser(
        "run", help="wait for a share of the GPUs, then run a command on it",
        usage="hwpool run [-h] [--gpus G | --mem SIZE] [--timeout S] [--time LIMIT] "
        "[--name NAME] [--priority P] [--no-start] [--socket PATH] [--grace S] "
        "[--reconnect-timeout S] -- CMD [ARGS...]",
        description="Wait in the host-wide queue for G of the GPUs (or SIZE of one GPU's "
        "memory), then run CMD with CUDA_VISIBLE_DEVICES set to them; exit with its status.",
    )  # fmt: skip
    run.add_argument(
        "--socket", metavar="PATH",
        help="the server's socket (default: $HWPOOL_SOCKET, else the machine-wide one "
        "($HWPOOL_SYSTEM_SOCKET, else /run/hwpool/hwpool.sock) if it is there, else the "
        "per-user one, where a server is started if none runs)",
    )  # fmt: skip
    run.add_argument(
        "--gpus", type=_args.demand_from_text, metavar="G",
        help="a fraction in (0, 1] of one GPU, or an integer >= 2 of whole GPUs (default 1)",
    )  # fmt: skip
    run.add_argument(
        "--mem", type=_args.memory_from_text, metavar="SIZE",
        help="SIZE of one GPU's memory instead (6GiB, 512MiB, 20G), on a server sized in memory "
        "(`hwpool serve --memory`; a server this starts is)",
    )  # fmt: skip
    run.add_argument(
        "--timeout", type=_args.seconds_or_zero, metavar="S",
        help=f"give up waiting after S s (exit {_exits.GAVE_UP})",
    )  # fmt: skip
    run.add_argument(
        "--time", type=_args.limit_from_text, metavar="LIMIT",
        help="a time limit for the job once it runs (90s, 30m, 2h, 1d, or seconds): past it "
        "the job's process group gets SIGTERM, SIGKILL --grace S later, and hwpool run exits "
        "124; the server counts on the limit (plus the grace), and may let the job start "
        "ahead of a wide request that waits",
    )  # fmt: skip
    run.add_argument("--name", metavar="NAME", help="a name for the job in `hwpool status`")
    run.add_argument(
        "--priority", type=_args.priority_from_text, default=0, metavar="P",
        help=f"an int in -{MAX_PRIORITY}..{MAX_PRIORITY} (default 0): higher goes first among "
        "your own waiting jobs; it never passes another user's",
    )  # fmt: skip
    run.add_argument(
        "--no-start", action="store_true",
        help="do not start a server when none runs (also: HWPOOL_AUTOSTART=0)",
    )  # fmt: skip
    run.add_argument(
        "--grace", type=_args.seconds_or_zero, default=RUN_GRACE_S, metavar="S",
        help="after CMD exits, what is left of its process group gets SIGTERM, and SIGKILL "
        f"S s later (default {RUN_GRACE_S:g})",
    )  # fmt: skip
    run.add_argument(
        "--reconnect-timeout", type=_args.seconds_or_zero, metavar="S",
        help="if the server goes away, wait S s for it to come back before giving the lease "
        "up and ending the job (default: $HWPOOL_RECONNECT_TIMEOUT, else until it is back)",
    )  # fmt: skip
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    run.set_defaults(run=_run)


# ----------------------------------------------------------------- submit
def _add_submit(commands: Subcommands) -> None:
    submit = commands.add_parser(
        "submit", help="queue a command to run on a share of the GPUs, after you log out too",
        usage="hwpool submit [-h] [--gpus G | --mem SIZE] [--name NAME] [--priority P] "
        "[--time LIMIT] [--after ID[,ID...]] [--after-any ID[,ID...]] [--after-notok ID[,ID...]] "
        "[--array SPEC] [--hold] [--notify CMD] [--cwd DIR] [--env KEY=VALUE] [--socket PATH] "
        "[--json] "
        "(-- CMD [ARGS...] | --from FILE)",
        description="Queue CMD as a job of yours and print its id (j1, j2, ...) at once. Your "
        "supervisor (started if none runs, detached from the terminal) runs it when the jobs "
        "it comes --after have succeeded and its share is granted, with this shell's "
        "environment and working directory, stdin from /dev/null, its output to `hwpool logs`.",
    )  # fmt: skip
    submit.add_argument(
        "--gpus", type=_args.demand_from_text, metavar="G",
        help="a fraction in (0, 1] of one GPU, or an integer >= 2 of whole GPUs (default 1)",
    )  # fmt: skip
    submit.add_argument(
        "--mem", type=_args.memory_from_text, metavar="SIZE",
        help="SIZE of one GPU's memory instead (6GiB, 512MiB), on a server sized in memory",
    )  # fmt: skip
    submit.add_argument("--name", metavar="NAME", help="a name (default: the command's name)")
    submit.add_argument(
        "--priority", type=_args.priority_from_text, default=0, metavar="P",
        help=f"an int in -{MAX_PRIORITY}..{MAX_PRIORITY} (default 0): higher goes first among "
        "your own jobs; it never passes another user's",
    )  # fmt: skip
    submit.add_argument(
        "--time", type=_args.limit_from_text, metavar="LIMIT",
        help="a time limit once it runs (90s, 30m, 2h, 1d): past it the job gets SIGTERM, "
        "SIGKILL 10 s later, and is recorded as timed-out",
    )  # fmt: skip
    submit.add_argument(
        "--after", type=_args.job_ids_argument, action="extend", default=[], metavar="ID[,ID...]",
        help="run only after these jobs of yours have succeeded (if one does not, this one is "
        "cancelled, never run)",
    )  # fmt: skip
    submit.add_argument(
        "--after-any", type=_args.job_ids_argument, action="extend", default=[],
        metavar="ID[,ID...]", help="run only after these jobs of yours have ended, however",
    )  # fmt: skip
    submit.add_argument(
        "--after-notok", type=_args.job_ids_argument, action="extend", default=[],
        metavar="ID[,ID...]", help="run only if one of these jobs of yours fails, times out, "
        "is cancelled or lost (clean-up, alerts); cancelled once they all succeeded",
    )  # fmt: skip
    submit.add_argument(
        "--notify", metavar="CMD",
        help="when the job ends, run CMD (a shell command, as you) with HWPOOL_JOB_ID, "
        "HWPOOL_JOB_NAME, HWPOOL_JOB_STATE, HWPOOL_JOB_EXIT set and the job's JSON on its "
        "stdin (default: notify in ~/.config/hwpool/config.toml; '' for none)",
    )  # fmt: skip
    submit.add_argument(
        "--array", type=_args.array_spec, metavar="SPEC",
        help="queue one job per index of SPEC, as Slurm's --array: 0-99, 1,3,7, 0-99:10, and "
        "%%K for at most K running at once (0-99%%4); prints the array's id, j12; its members "
        "are j12_0, j12_1, ..., each with HWPOOL_ARRAY_INDEX and HWPOOL_ARRAY_ID set",
    )  # fmt: skip
    submit.add_argument(
        "--hold", action="store_true",
        help="queue it held: it is not started until `hwpool release ID`",
    )  # fmt: skip
    submit.add_argument("--cwd", metavar="DIR", help="the working directory (default: this one)")
    submit.add_argument(
        "--env", type=_args.env_assignment, action="append", default=[], metavar="KEY=VALUE",
        help="set KEY to VALUE in the job's environment, over this shell's (repeatable)",
    )  # fmt: skip
    submit.add_argument(
        "--socket", metavar="PATH",
        help="the server the job waits on (default: as hwpool run chooses it); refused if "
        "your supervisor serves another one",
    )  # fmt: skip
    submit.add_argument(
        "--from", dest="batch", metavar="FILE",
        help="queue one job per line of FILE (- for stdin; words split as a shell splits them, "
        "empty lines and # comments skipped), all with these options, at once: all or none; "
        "prints one id per line",
    )  # fmt: skip
    submit.add_argument("--json", action="store_true", help="print the job as JSON")
    submit.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    submit.set_defaults(run=_submit)


# ----------------------------------------------------------------- jobs, logs, wait, retry
def _add_jobs(commands: Subcommands) -> None:
    jobs = commands.add_parser(
        "jobs", help="your jobs (hwpool submit): queued, running, and finished lately",
        description="Your jobs: queued, waiting on a dependency, running, and those that "
        f"finished in the last 24 hours (--all: every job kept). {JOB_ID_NOTE}.",
    )  # fmt: skip
    window = jobs.add_mutually_exclusive_group()
    window.add_argument("--all", action="store_true", help="every job kept, however old")
    window.add_argument(
        "--since", type=_args.limit_from_text, metavar="DURATION",
        help="the jobs that finished within DURATION (1h, 7d, 2-00:00), instead of 24 hours",
    )  # fmt: skip
    jobs.add_argument(
        "--state", type=_args.job_states, metavar="STATE[,STATE...]",
        help=f"only jobs in these states: {', '.join(_args.JOB_STATE_NAMES)} (queued also "
        "takes the jobs waiting on a dependency)",
    )  # fmt: skip
    jobs.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    jobs.add_argument(
        "ids", type=_args.job_id_argument, nargs="*", metavar="ID",
        help="only these jobs (an array's id: its members)",
    )  # fmt: skip
    whose = jobs.add_mutually_exclusive_group()
    whose.add_argument(
        "--user", metavar="NAME", help="root only: NAME's jobs (read-only, from their "
        "default state directory ~NAME/.local/state/hwpool)",
    )  # fmt: skip
    whose.add_argument(
        "--all-users", action="store_true", help="root only: every user's jobs (read-only)"
    )
    jobs.set_defaults(run=_jobs)

    logs = commands.add_parser(
        "logs", help="a job's output: its stdout, or --stderr; -f follows it",
        description="Print the output job ID wrote so far (its stdout; --stderr: its "
        "stderr). -f: keep printing what it writes until it finishes. Exit 1 if it has not "
        "started (without -f) or never did.",
    )  # fmt: skip
    logs.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="follow the output as it is written, until the job finishes",
    )
    logs.add_argument("--stderr", action="store_true", help="the job's stderr, not its stdout")
    logs.add_argument("id", type=_args.job_id_argument, metavar="ID", help="a job id, such as j12")
    logs.add_argument(
        "--user", metavar="NAME",
        help="root only: NAME's job, read as NAME reads it (their table and logs)",
    )  # fmt: skip
    logs.set_defaults(run=_logs)

    wait = commands.add_parser(
        "wait", help="wait for jobs to finish; exit with their status",
        description="Block until every job given has finished. Exit status: 0 if all "
        "succeeded, else that of the first job given that did not (its exit code, 128 + "
        f"the signal that killed it, {_exits.TIMED_OUT} timed out, {_exits.LOST} lost, "
        f"128 + signal or {_exits.CANCELLED} cancelled); {WAIT_TIMED_OUT} if --timeout passed "
        f"first; 2 for an unknown id; {_exits.HWPOOL_FAILED} if the table cannot be used.",
    )  # fmt: skip
    wait.add_argument(
        "--timeout", type=_args.wait_timeout, metavar="S",
        help=f"give up after S (seconds, or 90s, 30m, 2h): exit {WAIT_TIMED_OUT}; the jobs "
        "go on",
    )  # fmt: skip
    wait.add_argument("ids", type=_args.job_id_argument, nargs="+", metavar="ID",
                      help="job ids, such as j12")  # fmt: skip
    wait.set_defaults(run=_wait)

    update = commands.add_parser(
        "update", help="change a queued job in place: priority, time limit, share, name",
        usage="hwpool update [-h] ID [--priority P] [--time LIMIT] [--gpus G | --mem SIZE] "
        "[--name NAME] [--user NAME]",
        description="Change what is given of the queued job ID (or one waiting on a "
        "dependency), keeping its id and its place; its request is asked for again. A job "
        "that runs or has finished cannot be changed (exit 2).",
    )  # fmt: skip
    update.add_argument(
        "id", type=_args.job_id_argument, metavar="ID", help="a job id, such as j12"
    )
    update.add_argument("--priority", type=_args.priority_from_text, metavar="P",
                        help=f"an int in -{MAX_PRIORITY}..{MAX_PRIORITY}")  # fmt: skip
    update.add_argument("--time", type=_args.limit_from_text, metavar="LIMIT",
                        help="its time limit once it runs (90s, 30m, 2h, 1:30:00)")  # fmt: skip
    update.add_argument("--gpus", type=_args.demand_from_text, metavar="G",
                        help="a fraction in (0, 1] of one GPU, or an integer >= 2")  # fmt: skip
    update.add_argument("--mem", type=_args.memory_from_text, metavar="SIZE",
                        help="SIZE of one GPU's memory instead (6GiB)")  # fmt: skip
    update.add_argument("--name", metavar="NAME", help="its name")
    update.add_argument(
        "--user", metavar="NAME",
        help="root only: NAME's jobs, in NAME's own table (as NAME would; recorded as root's)",
    )  # fmt: skip
    update.set_defaults(run=_update)

    hold = commands.add_parser(
        "hold", help="keep queued jobs from starting until released",
        description="Hold each queued job ID (or one waiting on a dependency): it keeps its "
        "place among your jobs but is not started until `hwpool release ID`. A job that "
        "runs or has finished cannot be held: then nothing is held (exit 2).",
    )  # fmt: skip
    hold.add_argument("ids", type=_args.job_id_argument, nargs="+", metavar="ID",
                      help="job ids, such as j12")  # fmt: skip
    hold.add_argument(
        "--user", metavar="NAME",
        help="root only: NAME's jobs, in NAME's own table (as NAME would; recorded as root's)",
    )  # fmt: skip
    hold.set_defaults(run=_hold)

    release = commands.add_parser(
        "release", help="let held jobs start again",
        description="Release the hold on each job ID (hwpool hold, submit --hold): it starts "
        "in its place among your jobs once its share is granted.",
    )  # fmt: skip
    release.add_argument("ids", type=_args.job_id_argument, nargs="+", metavar="ID",
                         help="job ids, such as j12")  # fmt: skip
    release.add_argument(
        "--user", metavar="NAME",
        help="root only: NAME's jobs, in NAME's own table (as NAME would; recorded as root's)",
    )  # fmt: skip
    release.set_defaults(run=_release)

    retry = commands.add_parser(
        "retry", help="queue a finished job again, as a new job",
        description="Queue the finished job ID again as a new job (a new id; the old job "
        "keeps its record and logs) with the same command, environment, working directory, "
        "request and dependencies; print the new id.",
    )  # fmt: skip
    retry.add_argument("id", type=_args.job_id_argument, metavar="ID", help="a job id, such as j12")
    retry.add_argument("--json", action="store_true", help="print a JSON object instead")
    retry.set_defaults(run=_retry)


# ----------------------------------------------------------------- the commands, as they run
def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """The command ``name`` of ``module`` (relative to this package), imported when it
    runs, so that building the parser loads none of the commands."""

    def run(args: argparse.Namespace) -> int:
        command = getattr(importlib.import_module(module, __package__), name)
        return int(command(args))

    run.__name__ = run.__qualname__ = name
    return run


_info = _lazy("._tools", "cmd_info")
_demo = _lazy("._tools", "cmd_demo")
_simulate = _lazy("._tools", "cmd_simulate")
_bench = _lazy("._tools", "cmd_bench")
_serve = _lazy("._serve", "cmd_serve")
_status = _lazy("._host_cmds", "cmd_status")
_top = _lazy("._top", "cmd_top")
_drain = _lazy("._drain_cmds", "cmd_drain")
_resume = _lazy("._drain_cmds", "cmd_resume")


def _cancel(args: argparse.Namespace) -> int:
    """Job ids alone (``hwpool cancel j3 j4``) need only the job table; a server request id,
    ``--name``, ``--mine`` (or nothing, a usage error said there) go to the server's side;
    ``--user NAME``: another user's jobs (``_cancel_user``)."""
    if args.state is not None and args.user is None:
        print("hwpool: error: cancel: --state selects the jobs of --user NAME (all of NAME's "
              "jobs in those states); give --user NAME", file=sys.stderr)  # fmt: skip
        return _exits.USAGE
    if args.user is not None:
        from ._cancel_user import cmd_cancel_user

        return cmd_cancel_user(args)
    if args.ids and all(isinstance(i, str) for i in args.ids) and not (args.name or args.mine):
        from ._jobs_cmds import cmd_cancel as cancel_jobs

        return cancel_jobs(args)
    from ._host_cmds import cmd_cancel

    return cmd_cancel(args)


_run = _lazy("._run", "cmd_run")
_submit = _lazy("._submit", "cmd_submit")
_jobs = _lazy("._jobs_cmds", "cmd_jobs")
_logs = _lazy("._jobs_cmds", "cmd_logs")
_wait = _lazy("._jobs_cmds", "cmd_wait")
_retry = _lazy("._jobs_cmds", "cmd_retry")
_hold = _lazy("._jobs_cmds", "cmd_hold")
_update = _lazy("._jobs_cmds", "cmd_update")
_release = _lazy("._jobs_cmds", "cmd_release")
