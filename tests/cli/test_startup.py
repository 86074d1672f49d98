"""Each ``hwpool`` command loads only what it uses: the parser, built before every command,
loads no command's implementation, and the job commands load neither asyncio, the GPU pool,
the server, the supervisor nor the scheduler core. (How fast that is, ``bench/bench_jobs.py``
prints; no test here times anything.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hostserver import ENV
from hwpool._cli import _env
from hwpool._host._detect import NUM_GPUS_VAR
from hwpool._host._sizing import SPIN_VAR, THREADS_VAR
from hwpool._jobs._notify import NOTIFY_TIMEOUT_VAR
from hwpool._jobs._state import KEEP_COUNT_VAR, KEEP_VAR, LOG_MAX_VAR
from hwpool._numa._results import NUMA_VAR

SERVER_SIDE = {
    "asyncio", "hwpool._gpu._pool", "hwpool._backends._unix", "hwpool._server._server",
    "hwpool._server._host_state", "hwpool._jobs._supervisor", "hwpool._cpu._pool",
    "hwpool._numa._bind", "hwpool._sim._simulate",
}  # fmt: skip
"""What no command but those that need it (run, serve, demo, simulate, ...) may load."""
PROTOCOL = {"hwpool._wire._protocol", "hwpool._core._scheduler"}
JOB_TABLE = {"sqlite3", "hwpool._jobs._store"}
METRICS = {"prometheus_client", "hwpool._server._metrics"}
WATCHER = {"hwpool._watch", "hwpool._watch._open", "pynvml"}
"""The GPU watcher: only ``hwpool info`` on a machine whose GPUs answered loads it."""

RUN_MAIN = """
import json, sys
from hwpool._cli._main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, sorted(sys.modules)]))
"""


def loaded_by(
    tmp_path: Path, *argv: str, extra: dict[str, str] | None = None
) -> tuple[int, set[str]]:
    """``hwpool ARGV`` run by ``main`` in a fresh interpreter (no server, an empty state
    directory; ``extra`` variables added): its status and the modules it loaded."""
    env = {
        **ENV, "HWPOOL_STATE_DIR": str(tmp_path / "state"),
        "HWPOOL_SOCKET": str(tmp_path / "none.sock"), "HWPOOL_AUTOSTART": "0",
        "HWPOOL_SYSTEM_SOCKET": "", **(extra or {}),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", RUN_MAIN, *argv], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    code, modules = json.loads(done.stdout.splitlines()[-1])
    return code, set(modules)


def test_the_parser_loads_no_command(tmp_path: Path) -> None:
    code, modules = loaded_by(tmp_path, "--version")
    assert code == 0
    assert modules & (SERVER_SIDE | PROTOCOL | JOB_TABLE | METRICS | WATCHER | {"curses"}) == set()
    assert {m for m in modules if m.startswith("hwpool._cli.")} == {
        "hwpool._cli._args", "hwpool._cli._env", "hwpool._cli._main", "hwpool._cli._parser",
        "hwpool._cli._text",
    }  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs"],
        ["jobs", "--all", "--json"],
        ["logs", "j1"],
        ["wait", "j1"],
        ["retry", "j1"],
        ["cancel", "j1", "j2"],
    ],
    ids=" ".join,
)
def test_the_job_commands_load_no_server_side(tmp_path: Path, argv: list[str]) -> None:
    code, modules = loaded_by(tmp_path, *argv)
    assert code in (0, 2)  # 2: no such job (the state directory is empty)
    assert "hwpool._cli._jobs_cmds" in modules
    assert modules & (SERVER_SIDE | PROTOCOL) == set()


def test_info_without_gpu_hardware_loads_no_watcher(tmp_path: Path) -> None:
    # a count from a variable: no device that could be read live
    code, modules = loaded_by(tmp_path, "info", "--json", extra={"HWPOOL_NUM_GPUS": "2"})
    assert code == 0
    assert "hwpool._cli._info" in modules
    assert modules & (WATCHER | METRICS | JOB_TABLE) == set()


def test_submit_loads_the_client_but_no_server_side(tmp_path: Path) -> None:
    """What ``hwpool submit`` imports: its module (which imports all it uses when loaded)
    with the parser, not run (a run would start a supervisor). It asks the server whether it
    serves the user and could grant the request before queuing (issue 35), so the client
    (asyncio, ``GPUPool`` on the Unix backend, the protocol) is in; the server, the
    supervisor and the rest are not."""
    code = (
        "import json, sys\nimport hwpool._cli._submit\nfrom hwpool._cli._parser import build\n"
        "build().parse_args(['submit', '--gpus', '0.5', '--', 'true'])\n"
        "print(json.dumps([0, sorted(sys.modules)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    modules = set(json.loads(done.stdout)[1])
    assert "hwpool._jobs._submit" in modules
    client = {"asyncio", "hwpool._gpu._pool", "hwpool._backends._unix"} | PROTOCOL
    assert client <= modules
    assert modules & (SERVER_SIDE - client) == set()


@pytest.mark.parametrize(
    "argv",
    [["status"], ["cancel", "3"], ["cancel", "--mine"], ["top", "--once"], ["top"]],
    ids=" ".join,
)
def test_status_cancel_and_top_load_the_protocol_but_not_the_server(
    tmp_path: Path, argv: list[str]
) -> None:
    code, modules = loaded_by(tmp_path, *argv)
    assert code == 1  # no server answers
    assert modules >= PROTOCOL
    assert modules & (SERVER_SIDE | JOB_TABLE | METRICS) == set()
    assert "curses" not in modules  # only once a screen is drawn


def test_the_environment_check_knows_each_variable_by_its_modules_name() -> None:
    assert set(_env.CHECKED) == {
        NUM_GPUS_VAR, THREADS_VAR, SPIN_VAR, NUMA_VAR, _env.AUTOSTART_VAR, _env.RECONNECT_VAR,
        KEEP_VAR, KEEP_COUNT_VAR, LOG_MAX_VAR, NOTIFY_TIMEOUT_VAR,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HWPOOL_NUM_GPUS", "x"),
        ("HWPOOL_THREADS", "0"),
        ("HWPOOL_SPIN", "-1"),
        ("HWPOOL_NUMA", "sometimes"),
        ("HWPOOL_AUTOSTART", "2"),
        ("HWPOOL_RECONNECT_TIMEOUT", "soon"),
        ("HWPOOL_JOBS_KEEP", "forever"),
        ("HWPOOL_JOBS_KEEP_COUNT", "-3"),
        ("HWPOOL_JOBS_LOG_MAX", "12"),
        ("HWPOOL_NOTIFY_TIMEOUT", "0"),
    ],
)
def test_each_bad_variable_is_named(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable):
        _env.check_environment({variable: value})


def test_serve_loads_prometheus_client_only_for_metrics(tmp_path: Path) -> None:
    """``hwpool serve`` imports the metrics (and prometheus-client) only when
    ``--metrics-port`` is given; ``--check-config`` loads the server's modules without it."""
    socket = tmp_path / "run" / "s.sock"
    code, modules = loaded_by(tmp_path, "serve", "--socket", str(socket), "--check-config")
    assert code == 0
    assert "hwpool._cli._serve" in modules
    assert modules & METRICS == set()
