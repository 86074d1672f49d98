"""The suite is hermetic: on a box where hwpool is deployed, it never meets that deployment.

A decoy deployment is set up (tests/decoy.py: sockets that relay to a real server and count
who comes; a config file no server could start with), then the suite's own client and CLI
paths run against it: ``GPUPool()``, ``hwpool run``, ``status``, ``info``, ``submit``, a
server on the machine-wide socket, another user's client. The decoy must see no connection,
no config read and no job table made.

- ``configured``: a deployment named by the variables a site may set for every login
  (``HWPOOL_SOCKET``, ``HWPOOL_SYSTEM_SOCKET``, ``HWPOOL_CONFIG``, ``XDG_RUNTIME_DIR``,
  ``XDG_STATE_HOME``): any user can run it.
- ``defaults``: the documented default places themselves, ``/run/hwpool/hwpool.sock``,
  ``/etc/hwpool/serve.toml``, ``/tmp/hwpool-<uid>/hwpool.sock`` and ``~/.local/state/hwpool``:
  made for the test and removed after (root only; skipped where a real deployment is there).

Each runs a sample of the suite's own tests in a fresh ``pytest`` started from that
environment (so tests/conftest.py's isolation is what is proven), and the ``defaults`` one
also runs the sample's paths in this very process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import hermetic
from decoy import Relay
from hostserver import ENV, Server, run_cli
from hwpool import GPUPool
from hwpool._server._defaults import DEFAULT_CONFIG
from hwpool._wire._paths import SYSTEM_SOCKET

REPO = Path(__file__).resolve().parents[1]
SAMPLE = [
    "tests/gpu/test_gpu_pool.py::test_pool_detects_count_from_env",  # GPUPool()
    "tests/run/test_server_choice.py::test_status_and_info_name_the_machine_wide_server",
    "tests/run/test_server_choice.py::test_without_a_machine_wide_server_the_per_user_one_is_started",
    "tests/run/test_autostart.py::test_a_run_with_no_server_starts_one",
    "tests/run/test_run.py::test_two_half_gpu_runs_share_the_gpu_side_by_side",
    "tests/cli/test_cli.py::test_counts_of_one_are_singular",  # hwpool info, in a child
    "tests/submit/test_submit.py::test_output_goes_to_the_job_logs",
    "tests/cli/test_jobs_users.py::test_root_reads_every_users_jobs_and_changes_nothing",
    "tests/server/test_server_status.py::"
    "test_another_user_sees_names_but_not_command_lines_and_cancels_only_its_own",
]
"""The suite's own tests, one or two per client or CLI path (the users' ones skip when not
root)."""
NOT_TOML = "this is no TOML [\n"
"""The decoy config: a server that read it would refuse to start."""
SAMPLE_BOUND = 300.0  # seconds for the sample run (about 30 s on a loaded 2-core machine)


@dataclass
class Decoy:
    """A deployment's places: the sockets (relays), the config file and the job tables."""

    relays: list[Relay] = field(default_factory=list)
    config: Path | None = None
    states: list[Path] = field(default_factory=list)
    made: list[Path] = field(default_factory=list)  # removed at the end

    def untouched(self) -> None:
        for relay in self.relays:
            assert relay.connections == 0, f"the suite connected to the decoy at {relay.path}"
        for state in self.states:
            assert not (state / "hwpool").exists(), f"the suite made a job table in {state}"


@pytest.fixture
def upstream() -> Iterator[Server]:
    """The real server behind every decoy socket (so a stray client gets real answers)."""
    folder = Path(tempfile.mkdtemp(prefix="hwd", dir="/tmp"))
    server = Server(folder / "s.sock", "--gpus", "2")
    try:
        yield server.ready()
    finally:
        server.kill()
        shutil.rmtree(folder, ignore_errors=True)


def _folder(path: Path, mode: int, decoy: Decoy) -> Path:
    path.mkdir(mode=mode)
    path.chmod(mode)
    decoy.made.append(path)
    return path


@contextlib.contextmanager
def configured(upstream: Server) -> Iterator[tuple[Decoy, dict[str, str]]]:
    """A deployment that the site's variables name, in a folder of its own."""
    root = Path(tempfile.mkdtemp(prefix="hwd", dir="/tmp"))
    root.chmod(0o755)  # another user's client may look there too
    decoy = Decoy(made=[root])
    try:
        run = _folder(root / "run", 0o755, decoy)
        runtime = _folder(root / "xdg", 0o700, decoy)
        _folder(runtime / "hwpool", 0o700, decoy)
        decoy.relays += [
            Relay(run / "hwpool.sock", upstream.socket),
            Relay(runtime / "hwpool" / "hwpool.sock", upstream.socket),
        ]
        decoy.config = root / "serve.toml"
        decoy.config.write_text(NOT_TOML)
        decoy.states.append(root / "state")
        env = {
            "HWPOOL_SOCKET": str(run / "hwpool.sock"),
            "HWPOOL_SYSTEM_SOCKET": str(run / "hwpool.sock"),
            "HWPOOL_CONFIG": str(decoy.config),
            "XDG_RUNTIME_DIR": str(runtime),
            "XDG_STATE_HOME": str(root / "state"),
        }
        yield decoy, env
    finally:
        _remove(decoy)


@contextlib.contextmanager
def defaults(upstream: Server) -> Iterator[tuple[Decoy, dict[str, str]]]:
    """A deployment in the documented default places, made for the test (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make /run/hwpool and /etc/hwpool for the decoy")
    system, config = Path(SYSTEM_SOCKET), DEFAULT_CONFIG
    per_user = Path(f"/tmp/hwpool-{os.getuid()}")
    for place in (system.parent, config.parent, per_user):
        if place.exists():
            pytest.skip(f"{place} exists (a real deployment?): the decoy would replace it")
    home = Path(tempfile.mkdtemp(prefix="hwd", dir="/tmp"))
    decoy = Decoy(made=[home], states=[home / ".local" / "state"])
    try:
        _folder(system.parent, 0o755, decoy)
        _folder(config.parent, 0o755, decoy)
        _folder(per_user, 0o700, decoy)
        decoy.relays += [
            Relay(system, upstream.socket),
            Relay(per_user / "hwpool.sock", upstream.socket),
        ]
        config.write_text(NOT_TOML)
        decoy.config = config
        yield decoy, {"HWPOOL_SOCKET": str(system), "HOME": str(home)}
    finally:
        _remove(decoy)


def _remove(decoy: Decoy) -> None:
    for relay in decoy.relays:
        relay.close()
    if decoy.config is not None:
        decoy.config.unlink(missing_ok=True)
    for path in reversed(decoy.made):
        shutil.rmtree(path, ignore_errors=True)


def deployed_shell(places: dict[str, str]) -> dict[str, str]:
    """The environment of a login on the deployed box: this one without the suite's own
    places (as before any pytest ran), with the deployment's."""
    drop = {hermetic.ROOT_VAR, *hermetic.MACHINE, *hermetic.PER_USER}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PYTHONPATH": ENV["PYTHONPATH"], **places}


def run_sample(env: dict[str, str]) -> None:
    """The sample of the suite, in a fresh pytest run from ``env``: it must pass."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SAMPLE],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=SAMPLE_BOUND, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


DEPLOYMENTS = {"configured": configured, "defaults": defaults}


@pytest.mark.timeout(SAMPLE_BOUND + 60)
@pytest.mark.parametrize("kind", DEPLOYMENTS)
def test_the_suite_never_meets_a_deployed_hwpool(upstream: Server, kind: str) -> None:
    with DEPLOYMENTS[kind](upstream) as (decoy, places):
        run_sample(deployed_shell(places))
        decoy.untouched()


@pytest.mark.timeout(60)
def test_this_session_never_meets_the_default_places(upstream: Server) -> None:
    # The same paths in this process (and a child), in the session conftest.py set up.
    with defaults(upstream) as (decoy, _):
        assert GPUPool().num_gpus >= 1
        code, _, err = run_cli("status")
        assert code == 1 and "no hwpool server on" in err, err  # none where the suite looks
        code, out, err = run_cli("info", "--json")
        assert code == 0, err
        assert json.loads(out)["server"]["kind"] == "per-user"
        system = os.environ["HWPOOL_SYSTEM_SOCKET"]
        code, out, err = run_cli("serve", "--socket", system, "--check-config")
        assert code == 0 and "# config file: none" in out, out + err
        child = subprocess.run(
            [sys.executable, "-m", "hwpool", "run", "--", "true"], capture_output=True,
            text=True, env={**ENV, "HWPOOL_AUTOSTART": "0"}, timeout=60, check=False,
        )  # fmt: skip
        assert child.returncode == 125, child.stderr  # no server where the suite looks
        decoy.untouched()
