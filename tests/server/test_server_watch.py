"""The GPU watch wired into ``hwpool serve``: real server processes over a fake NVML.

The server loads ``tests/fakes/nvml_file/pynvml.py`` (first on its PYTHONPATH), which reads
the machine from a JSON file this test rewrites: a process appears on a GPU, uses memory,
disappears, or NVML fails. The jobs are real processes (``hwpool run`` and its child, or a
plain ``sleep``); the test names their pids in the file. Every wait is on the server's log
or on ``hwpool status --json``, bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakemachine import TOTAL, UUID, Machine

from hostserver import BOUND, ClientProc, Server, run_cli, status_of
from hwpool._jobs._model import JobState
from jobbox import Box
from runproc import Run


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start plain processes that stand for GPU users outside the queue (killed at the end)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(BOUND)


def test_an_outside_process_shrinks_what_is_granted_and_gives_it_back(
    machine: Machine, sleeper: Callable[[], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    machine.start()
    outsider = sleeper()
    machine.set({outsider.pid: 10000})
    status = machine.until(lambda s: s["gpus"][0]["live"]["withheld_mib"] == 10000, "withheld")
    assert status["gpus"][0]["free_mib"] == TOTAL - 10000
    (process,) = status["outside"]
    assert process == {"pid": outsider.pid, "uid": os.getuid(), "user": process["user"],
                       "gpu": 0, "used_mib": 10000}  # fmt: skip
    assert process["user"]
    client = ClientProc(machine.socket)
    try:
        client.send("mem a 8000")  # fits the GPU, not what is left of it
        machine.until(lambda s: len(s["waiting"]) == 1, "the request waits")
        outsider.kill()
        outsider.wait(BOUND)
        machine.set({})
        client.expect("granted a [0]")
        status = machine.status()
        assert status["gpus"][0]["live"]["withheld_mib"] == 0 and status["outside"] == []
    finally:
        client.kill()


def test_on_a_server_of_fractions_outside_memory_is_withheld_as_its_share(
    machine: Machine, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    machine.start(memory=False)
    client = ClientProc(machine.socket)
    try:
        client.send("acquire a 0.25")
        client.expect("granted a [0]")
        outsider = sleeper()
        machine.set({outsider.pid: 6000})  # 0.366 of the GPU withheld (rounded up in units)
        status = machine.until(lambda s: s["gpus"][0]["live"]["withheld_mib"] == 6000, "held")
        assert status["gpus"][0]["free"] == pytest.approx(0.75 - 6000 / TOTAL, abs=1e-5)
        client.send("acquire b 0.5")  # would fit the 0.75 the lease leaves, not 0.38
        machine.until(lambda s: len(s["waiting"]) == 1, "b waits")
        client.send("release a")
        said = {client.expect(""), client.expect("")}  # the grant may come first: either order
        assert said == {"released a", "granted b [0]"}  # 1 - 0.366 >= 0.5
    finally:
        client.kill()


def test_status_json_shows_the_gpus_the_processes_and_each_lease_use(
    machine: Machine, tmp_path: Path
) -> None:
    server = machine.start()
    run = Run(server, tmp_path, "job", "wait=go", options=("--mem", "4GiB"))
    try:
        job = run.started()["pid"]
        machine.set({job: 1500})
        status = machine.until(
            lambda s: s["leases"] and s["leases"][0].get("used_mib") == 1500, "the lease's use"
        )
        watch = status["watch"]
        assert watch["source"] == "nvml" and watch["interval_s"] == 0.05
        assert watch["problem"] == "" and watch["age_s"] >= 0
        assert status["gpus"][0]["uuid"] == UUID
        assert status["gpus"][0]["live"] == {"total_mib": TOTAL, "used_mib": 1500,
                                             "utilization": 37, "withheld_mib": 0}  # fmt: skip
        assert status["outside"] == []
        assert status["leases"][0]["over_lease"] is False
        code, out, _ = run_cli("status", "--socket", str(machine.socket))
        assert code == 0
        assert "(now: 1500MiB of 16GiB used, 37% busy)" in out, out
        assert "uses 1500MiB" in out and "outside the queue (0):" in out
    finally:
        (tmp_path / "go").touch()
        code, err = run.finish()
    assert code == 0, err
    assert "uses" not in err


def test_an_over_lease_job_is_flagged_on_its_stderr_and_in_status(
    machine: Machine, tmp_path: Path
) -> None:
    server = machine.start()
    run = Run(server, tmp_path, "job", "wait=go", options=("--mem", "2GiB"))
    try:
        job = run.started()["pid"]
        machine.set({job: 5000})
        line = server.wait_for("uses 5000 MiB of GPU 0, more than its 2048 MiB")
        assert "lease #" in line
        status = machine.until(lambda s: s["leases"][0].get("over_lease"), "flagged")
        assert status["leases"][0]["allowed_mib"] == 2048
        assert status["leases"][0]["used_mib"] == 5000
    finally:
        (tmp_path / "go").touch()
        code, err = run.finish()
    assert code == 0, err  # warn: flagged, not ended
    assert "hwpool: lease #" in err and "uses 5000 MiB of GPU 0, more than its 2048 MiB" in err


def test_term_ends_only_the_over_lease_job_after_the_grace(
    machine: Machine, tmp_path: Path
) -> None:
    server = machine.start("--over-lease", "term", "--over-lease-grace", "0.2")
    greedy = Run(server, tmp_path, "greedy", "sleep", options=("--mem", "2GiB"))
    modest = Run(server, tmp_path, "modest", "wait=go", options=("--mem", "2GiB"))
    try:
        hog, fine = greedy.started()["pid"], modest.started()["pid"]
        machine.set({hog: 5000, fine: 1000})
        code, err = greedy.finish()
        assert code != 0
        assert "ended for overuse" in err
        server.wait_for("ended for overuse")
        status = machine.until(lambda s: len(s["leases"]) == 1, "one lease left")
        assert status["leases"][0]["pid"] == modest.pid
        assert status["counters"]["ended_for_overuse"] == 1
        assert modest.proc.poll() is None  # untouched
    finally:
        (tmp_path / "go").touch()
        greedy.kill()
        code, err = modest.finish()
    assert code == 0, err


def test_a_submitted_job_counts_under_its_launcher_and_is_ended_for_overuse(
    machine: Machine, sockdir: Path
) -> None:
    """The launcher takes the lease over, so the lease's connection is the launcher's and
    the job, its child, counts under it: flagged in the job's stderr log, then ended."""
    server = machine.start("--over-lease", "term", "--over-lease-grace", "0.2")
    (sockdir / "box").mkdir()
    box = Box(server, sockdir / "box")
    try:
        job_id = box.submit("--mem", "2GiB", job=["big", "wait=never"])
        running = box.running(job_id)
        pid = int(json.loads(box.wait_file("big.started").read_text())["pid"])
        assert status_of(machine.socket)["leases"][0]["pid"] == running.pid  # the launcher
        machine.set({pid: 5000})
        ended = box.finished(job_id)
        assert ended.state is JobState.CANCELLED
        assert ended.reason is not None and "ended for overuse" in ended.reason
        assert ended.stderr_log is not None
        log = Path(ended.stderr_log).read_text()
        assert "uses 5000 MiB of GPU 0, more than its 2048 MiB" in log
        assert "was ended for overuse" in log
    finally:
        box.kill_all()


def test_nvml_errors_mid_run_do_not_stop_the_server(
    machine: Machine, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    server = machine.start()
    outsider = sleeper()
    machine.set({outsider.pid: 3000})
    machine.until(lambda s: s["gpus"][0]["live"]["withheld_mib"] == 3000, "withheld")
    mark = len(server.lines)
    machine.set({outsider.pid: 3000}, failing={"nvmlDeviceGetCount": "GPU is lost"})
    server.wait_for("GPU watch: NVML failed", after=mark)
    status = machine.until(lambda s: "GPU is lost" in s["watch"]["problem"], "the problem")
    assert status["gpus"][0]["live"]["withheld_mib"] == 3000  # unknown is not zero
    machine.set({outsider.pid: 3000}, failing={"nvmlDeviceGetComputeRunningProcesses": "oops"})
    server.wait_for("nvmlDeviceGetComputeRunningProcesses failed", after=mark)
    machine.set({})
    server.wait_for("sampling works again", after=mark)
    machine.until(lambda s: s["gpus"][0]["live"]["withheld_mib"] == 0, "given back")
    assert server.proc.poll() is None


def test_a_lease_on_a_gpu_whose_processes_cannot_be_read_uses_an_unknown_amount(
    machine: Machine, tmp_path: Path
) -> None:
    """Unknown is not zero: while NVML cannot list a GPU's processes, a lease there is shown
    as using an unknown amount (``uses ?``), not 0 MiB; it was 0 before."""
    server = machine.start()
    run = Run(server, tmp_path, "job", "wait=go", options=("--mem", "4GiB"))
    try:
        job = run.started()["pid"]
        machine.set({job: 1500})
        machine.until(lambda s: s["leases"][0].get("used_mib") == 1500, "the lease's use")
        mark = len(server.lines)
        machine.set({job: 1500}, failing={"nvmlDeviceGetComputeRunningProcesses": "oops"})
        server.wait_for("nvmlDeviceGetComputeRunningProcesses failed", after=mark)
        status = machine.until(
            lambda s: "used_mib" in s["leases"][0] and s["leases"][0]["used_mib"] is None,
            "the lease's use unknown",
        )
        assert status["leases"][0]["over_lease"] is False
        code, out, _ = run_cli("status", "--socket", str(machine.socket))
        assert code == 0 and "uses ?" in out, out
    finally:
        (tmp_path / "go").touch()
        run.finish()


def test_an_owners_own_policy_overrides_the_servers(machine: Machine, tmp_path: Path) -> None:
    config = machine.directory / "serve.toml"
    config.write_text(
        'over_lease = "term"\nover_lease_grace = 0\n'
        f'[over_lease_owners]\n"uid:{os.getuid()}" = "off"\n'
    )
    config.chmod(0o600)
    server = machine.start("--config", str(config))
    run = Run(server, tmp_path, "job", "wait=go", options=("--mem", "2GiB"))
    try:
        job = run.started()["pid"]
        machine.set({job: 5000})
        status = machine.until(lambda s: s["leases"][0]["over_lease"], "flagged")
        assert status["counters"]["ended_for_overuse"] == 0
    finally:
        (tmp_path / "go").touch()
        code, err = run.finish()
    assert code == 0, err  # off: flagged in status only, not said, not ended
    assert "uses 5000 MiB" not in err
    assert not [line for line in server.lines if "uses 5000 MiB" in line]


def test_memory_left_out_at_start_is_not_withheld_twice(
    machine: Machine, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    outsider = sleeper()
    machine.set({outsider.pid: 4000})
    server = machine.start("--reserve-in-use")
    status = machine.until(lambda s: s["gpus"][0]["live"]["withheld_mib"] == 4000, "seen")
    assert status["gpus"][0]["total_mib"] == TOTAL - 4000
    assert status["gpus"][0]["free_mib"] == TOTAL - 4000  # left out at start already
    machine.set({outsider.pid: 6000})  # 2000 MiB more than at start: those are withheld
    status = machine.until(lambda s: s["gpus"][0]["live"]["withheld_mib"] == 6000, "more")
    assert status["gpus"][0]["free_mib"] == TOTAL - 6000
    assert server.stop() == 0  # a watching server stops cleanly
    server.wait_for("stopped")


def test_logical_gpus_are_not_watched(sockdir: Path) -> None:
    server = Server(sockdir / "s.sock", "--gpus", "2").ready()
    try:
        server.wait_for("not watched (logical GPUs, without UUIDs)")
        status = status_of(server.socket)
        assert status["watch"] is None and status["outside"] == []
        assert all(gpu["live"] is None for gpu in status["gpus"])
    finally:
        server.kill()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--watch-interval", "-1"), "--watch-interval: must be a number of seconds >= 0 or off"),
        (("--watch-interval", "soon"), "'soon'"),
        (("--over-lease", "kill"), "--over-lease: invalid choice: 'kill'"),
        (("--over-lease-grace", "-5"), "--over-lease-grace: must be a number of seconds >= 0"),
    ],
)
def test_bad_watch_flags_are_refused(args: tuple[str, ...], message: str, sockdir: Path) -> None:
    code, _, err = run_cli("serve", "--socket", str(sockdir / "s.sock"), *args)
    assert code == 2
    assert message in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('over_lease = "kill"', "over_lease: must be one of 'warn', 'term', 'off', got 'kill'"),
        ("watch_interval = -2", "watch_interval: must be a number of seconds >= 0"),
        ('watch_interval = "often"', "watch_interval: must be a number of seconds >= 0"),
        ("over_lease_grace = -1", "over_lease_grace: must be a number of seconds >= 0"),
        ('[over_lease_owners]\nnobody_here_x = "term"', "over_lease_owners.nobody_here_x"),
        ('[over_lease_owners]\nroot = "stop"', "over_lease_owners.root: must be one of"),
    ],
)
def test_bad_watch_keys_are_refused_naming_key_and_value(
    text: str, message: str, sockdir: Path
) -> None:
    config = sockdir / "hwpool.toml"
    config.write_text(text + "\n")
    config.chmod(0o600)
    code, _, err = run_cli(
        "serve", "--socket", str(sockdir / "s.sock"), "--config", str(config), "--check-config"
    )
    assert code == 2
    assert message in err


def test_check_config_shows_the_watch_settings(sockdir: Path) -> None:
    config = sockdir / "hwpool.toml"
    config.write_text(
        'watch_interval = "off"\nover_lease = "term"\nover_lease_grace = 5\n'
        '[over_lease_owners]\n"uid:0" = "off"\n'
    )
    config.chmod(0o600)
    code, out, err = run_cli(
        "serve", "--socket", str(sockdir / "s.sock"), "--config", str(config), "--check-config"
    )
    assert code == 0, err
    assert "watch_interval = 0.0" in out and 'over_lease = "term"' in out
    assert "over_lease_grace = 5.0" in out
    assert "[over_lease_owners]" in out and '"uid:0" = "off"' in out
    code, out, err = run_cli("serve", "--socket", str(sockdir / "s.sock"), "--check-config")
    assert "watch_interval = 2.0" in out and 'over_lease = "warn"' in out


# The watcher's live fields as `hwpool top` and the metrics show them: `status --json`,
# `top --once` and `GET /metrics`, read at one quiet moment, agree on every live figure.
MIB = 2**20


def test_status_top_and_metrics_agree_on_what_the_gpu_does(
    machine: Machine, sleeper: Callable[[], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    pytest.importorskip("prometheus_client", reason="the metrics need prometheus-client")
    from test_server_metrics import metrics_url, samples, scrape, value  # noqa: PLC0415

    server = machine.start("--metrics-port", "0")
    url = metrics_url(server)
    run = Run(server, tmp_path, "job", "wait=go", options=("--mem", "4GiB"))
    try:
        job = run.started()["pid"]
        outsider = sleeper()
        machine.set({job: 1500, outsider.pid: 3000})
        status = machine.until(
            lambda s: (
                s["gpus"][0]["live"]["withheld_mib"] == 3000
                and s["leases"][0].get("used_mib") == 1500
            ),
            "the outside memory withheld and the lease's use seen",
        )
        found = samples(scrape(url))
        code, top, err = run_cli("top", "--socket", str(machine.socket), "--once")
        again = machine.status()
    finally:
        (tmp_path / "go").touch()
        run.finish()
    assert code == 0, err
    live = status["gpus"][0]["live"]
    assert again["gpus"][0]["live"] == live and again["outside"] == status["outside"]
    assert live == {"total_mib": TOTAL, "used_mib": 4500, "utilization": 37, "withheld_mib": 3000}
    (process,) = status["outside"]
    assert process["pid"] == outsider.pid and process["used_mib"] == 3000
    # the metrics: bytes and a ratio, per GPU; a lease's own use is in the status only (the
    # metrics port names no one's jobs)
    assert value(found, "hwpool_gpu_memory_used_bytes", gpu="0") == 4500 * MIB
    assert value(found, "hwpool_gpu_memory_total_bytes", gpu="0") == TOTAL * MIB
    assert value(found, "hwpool_gpu_withheld_bytes", gpu="0") == 3000 * MIB
    assert value(found, "hwpool_gpu_utilization_ratio", gpu="0") == pytest.approx(0.37)
    assert value(found, "hwpool_outside_processes") == 1
    assert value(found, "hwpool_outside_memory_bytes", gpu="0") == 3000 * MIB
    lease = status["leases"][0]
    assert not any(name.startswith("hwpool_lease_memory") for name, _ in found)
    assert lease["used_mib"] == 1500 and value(found, "hwpool_leases_over") == 0
    # top: the lease's use and the outsider, in words
    assert f"#{lease['id']}" in top and "uses 1500MiB" in top, top
    assert "outside the queue" in top and str(outsider.pid) in top, top
