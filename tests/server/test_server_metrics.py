"""``hwpool serve --metrics-port``: the Prometheus endpoint of a real server.

Each test starts the real server on a temporary socket with metrics on a free port (the log
says which), brings it to a quiet state (leases, waiters, a revocation), and checks that
``GET /metrics`` parses (prometheus-client's own parser; ``promtool check metrics`` where it is
installed) and says what ``hwpool status --json`` says at the same moment. The families are
also checked directly on a snapshot with the live GPU fields a watching server adds.
"""

from __future__ import annotations

import math
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="the metrics need prometheus-client")

from prometheus_client.parser import text_string_to_metric_families

from hostserver import BOUND, Server, run_cli, status_of
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._host._detect import GPUInfo
from hwpool._server._metrics import (
    MetricsEndpoint,
    Snapshot,
    WaitCounts,
    families,
    size_class,
)
from rawpeers import LinePeer

StartServer = Callable[..., Server]
MIB = 1 << 20
HALF = UNITS_PER_GPU // 2
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# ----------------------------------------------------------------- helpers
@pytest.fixture
def peers() -> Iterator[Callable[[Path], LinePeer]]:
    opened: list[LinePeer] = []

    def open_peer(path: Path) -> LinePeer:
        opened.append(LinePeer(path))
        return opened[-1]

    yield open_peer
    for peer in opened:
        peer.close()


def metrics_url(server: Server) -> str:
    line = server.wait_for("metrics on ")
    found = re.search(r"(http://\S+/metrics)", line)
    assert found, line
    return found.group(1)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=BOUND) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        return str(answer.read().decode())


def samples(text: str) -> Samples:
    """Every sample of the exposition, by name and sorted labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def promtool_check(text: str) -> None:
    """``promtool check metrics`` on ``text``, where promtool is installed."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True,
        timeout=BOUND, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


# ----------------------------------------------------------------- a real server
def test_the_metrics_say_what_status_says(
    start_server: StartServer, peers: Callable[[Path], LinePeer]
) -> None:
    server = start_server("--gpus", "2", "--metrics-port", "0")
    url = metrics_url(server)
    holder, first, second = peers(server.socket), peers(server.socket), peers(server.socket)
    assert holder.acquire(1, name="whole") == "granted"  # GPU 0
    assert first.acquire(2, units=HALF, name="half") == "granted"  # half of GPU 1
    assert second.acquire(1, units=3 * UNITS_PER_GPU // 4, name="most") == "queued"
    assert second.acquire(2, count=2, name="both") == "queued"  # 2 whole GPUs
    whole = next(x["id"] for x in status_of(server.socket)["leases"] if x["name"] == "whole")
    code, _, err = run_cli("cancel", "--socket", str(server.socket), str(whole))
    assert code == 0, err
    assert holder.read()["op"] == "revoked"
    holder.close()  # its GPU is free once its holder is gone
    assert second.read()["op"] == "granted"  # "most", first in the queue, takes GPU 0

    report = status_of(server.socket)  # the server is quiet now: nothing moves
    text = scrape(url)
    found = samples(text)

    assert value(found, "hwpool_gpus") == len(report["gpus"]) == 2
    for gpu in report["gpus"]:
        assert math.isclose(value(found, "hwpool_gpu_free_ratio", gpu=str(gpu["index"])),
                            gpu["free"])  # fmt: skip
    assert value(found, "hwpool_leases") == len(report["leases"]) == 2
    assert value(found, "hwpool_queue_length") == len(report["waiting"]) == 1
    assert value(found, "hwpool_queue_requests", size="2gpus") == 1
    # Per reason (issue 37): "both" is first in line, waiting for two whole GPUs.
    assert report["waiting"][0]["reason"] == "resources"
    assert value(found, "hwpool_queue_reason_requests", reason="resources") == 1
    assert value(found, "hwpool_queue_reason_requests", reason="priority") == 0
    counters = report["counters"]
    assert value(found, "hwpool_grants_total") == counters["granted"] == 3
    assert value(found, "hwpool_releases_total") == counters["released"] == 1
    assert value(found, "hwpool_cancellations_total") == counters["cancelled"] == 0
    assert value(found, "hwpool_timeouts_total") == counters["timed_out"] == 0
    assert value(found, "hwpool_revocations_total", reason="cancel") == 1
    assert value(found, "hwpool_revocations_total", reason="limit") == 0
    assert value(found, "hwpool_journal_ok") == 1
    assert value(found, "hwpool_metrics_failures_total") == 0
    assert value(found, "hwpool_recovering_seconds") == 0
    oldest = value(found, "hwpool_queue_oldest_wait_seconds")
    assert oldest >= report["waiting"][0]["waited_s"]  # the scrape came after the status
    # The waits of the grants: whole and half at once, most after waiting.
    assert value(found, "hwpool_wait_seconds_count", size="1gpu") == 1
    assert value(found, "hwpool_wait_seconds_count", size="fraction") == 2
    assert value(found, "hwpool_wait_seconds_bucket", size="fraction", le="0.01") >= 1
    assert sum(v for (name, _), v in found.items()
               if name == "hwpool_wait_seconds_count") == counters["granted"]  # fmt: skip
    assert not any(name.startswith("hwpool_gpu_memory") for name, _ in found)  # not watching
    promtool_check(text)


def test_a_server_sized_in_memory_exports_bytes(
    start_server: StartServer, peers: Callable[[Path], LinePeer]
) -> None:
    server = start_server("--gpu-memory", "80GiB,24GiB", "--metrics-port", "0")
    url = metrics_url(server)
    peer = peers(server.socket)
    assert peer.acquire(1, units=6144, unit="mib", name="six") == "granted"
    report = status_of(server.socket)
    found = samples(scrape(url))
    for gpu in report["gpus"]:
        index = str(gpu["index"])
        assert value(found, "hwpool_gpu_free_bytes", gpu=index) == gpu["free_mib"] * MIB
        assert value(found, "hwpool_gpu_capacity_bytes", gpu=index) == gpu["total_mib"] * MIB
    assert value(found, "hwpool_wait_seconds_count", size="memory") == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_metrics(
    start_server: StartServer, peers: Callable[[Path], LinePeer]
) -> None:
    server = start_server("--gpus", "1", "--metrics-port", "0")
    peer = peers(server.socket)
    assert peer.acquire(1, units=HALF) == "granted"
    assert peer.acquire(2) == "queued"
    promtool_check(scrape(metrics_url(server)))


# ----------------------------------------------------------------- bad usage
def test_without_prometheus_client_metrics_are_refused_clearly(
    sockdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    path = sockdir / "s.sock"
    code, out, err = run_cli("serve", "--socket", str(path), "--gpus", "1", "--metrics-port", "0")
    assert code == 2
    assert out == ""
    assert err == (
        "hwpool: error: --metrics-port needs prometheus-client, which is not installed: pip "
        "install 'hwpool[metrics]' (or prometheus-client)\n"
    )
    assert not path.exists()


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_bad_metrics_port_is_refused_naming_it(sockdir: Path, port: str) -> None:
    code, _, err = run_cli("serve", "--socket", str(sockdir / "s.sock"), "--metrics-port", port)
    assert code == 2
    assert f"argument --metrics-port: must be a port number 0..65535, got {port!r}" in err


def test_a_port_in_use_is_refused_and_leaves_no_socket(sockdir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = sockdir / "s.sock"
        code, _, err = run_cli(
            "serve", "--socket", str(path), "--gpus", "1", "--metrics-port", str(port)
        )
    assert code == 2
    assert err.startswith(f"hwpool: error: --metrics-port: cannot listen on 127.0.0.1:{port}: ")
    assert not path.exists()


def test_the_config_file_sets_the_metrics_port(sockdir: Path) -> None:
    config = sockdir / "serve.toml"
    config.write_text('metrics_port = 9464\nmetrics_host = "0.0.0.0"\n')
    code, out, err = run_cli("serve", "--socket", str(sockdir / "s.sock"), "--config",
                             str(config), "--check-config")  # fmt: skip
    assert (code, err) == (0, "")
    assert "metrics_port = 9464\n" in out
    assert 'metrics_host = "0.0.0.0"\n' in out
    config.write_text("metrics_port = 65536\n")
    code, _, err = run_cli("serve", "--socket", str(sockdir / "s.sock"), "--config",
                           str(config), "--check-config")  # fmt: skip
    assert code == 2
    assert "metrics_port" in err and "65536" in err


# ----------------------------------------------------------------- the families, directly
def test_size_classes() -> None:
    full = UNITS_PER_GPU
    assert [size_class(1, HALF, "gpu", full), size_class(1, full, "gpu", full),
            size_class(2, full, "gpu", full), size_class(4, full, "gpu", full),
            size_class(8, full, "gpu", full), size_class(9, full, "gpu", full),
            size_class(1, 6144, "mib", full)] == [
        "fraction", "1gpu", "2gpus", "3-4gpus", "5-8gpus", "9+gpus", "memory"
    ]  # fmt: skip


def test_the_live_gpu_fields_are_exported_when_present() -> None:
    """What a watching server adds to its status (docs/observability.md) becomes GPU memory
    and utilisation, memory withheld, and processes outside the queue: per GPU, never per
    lease or per process (that would name their owners' jobs)."""
    status = {
        "free": [0, UNITS_PER_GPU], "granted": 1, "released": 0, "cancelled": 0,
        "timed_out": 0, "recovering_s": 0.0, "uptime_s": 5.0,
        "leases": [{"id": 7, "uid": 0, "pid": 1, "held": [[0, UNITS_PER_GPU]], "age_s": 1.0,
                    "used_mib": 2048, "over_lease": True, "allowed_mib": 1024}],
        "waiting": [],
        "gpu_state": [
            {"gpu": 0, "uuid": "GPU-a", "total_mib": 4096, "used_mib": 3072, "utilization": 40,
             "withheld_mib": 1024},
            {"gpu": 1, "uuid": "GPU-b", "total_mib": 4096, "used_mib": None,
             "utilization": None, "withheld_mib": 0},
        ],
        "outside": [{"pid": 9, "uid": 0, "user": "root", "gpu": 0, "used_mib": 1024}],
        "outside_left_out": 3, "ended_for_overuse": 2,
    }  # fmt: skip
    counts = WaitCounts()
    counts.observe(0.0)
    snap = Snapshot(status, (GPUInfo(0, "0"), GPUInfo(1, "1")), None, UNITS_PER_GPU,
                    {"1gpu": counts}, {"overuse": 2})  # fmt: skip
    found: Samples = {}
    for family in families(snap):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert value(found, "hwpool_gpu_memory_used_bytes", gpu="0") == 3072 * MIB
    assert ("hwpool_gpu_memory_used_bytes", (("gpu", "1"),)) not in found  # unknown: left out
    assert value(found, "hwpool_gpu_memory_total_bytes", gpu="1") == 4096 * MIB
    assert value(found, "hwpool_gpu_utilization_ratio", gpu="0") == pytest.approx(0.4)
    assert value(found, "hwpool_gpu_withheld_bytes", gpu="0") == 1024 * MIB
    assert not any(name.startswith("hwpool_lease_memory") for name, _ in found)
    assert {label for _, labels in found for label, _ in labels} <= {"gpu", "size", "reason", "le"}
    assert value(found, "hwpool_leases_over") == 1
    assert value(found, "hwpool_outside_processes") == 4
    assert value(found, "hwpool_outside_memory_bytes", gpu="0") == 1024 * MIB
    assert value(found, "hwpool_leases_ended_for_overuse_total") == 2
    assert value(found, "hwpool_revocations_total", reason="overuse") == 2
    assert value(found, "hwpool_wait_seconds_bucket", size="1gpu", le="+Inf") == 1


def test_a_failure_while_counting_never_reaches_the_grant() -> None:
    """The hooks run in the server's loop, inside a grant: an error of theirs is counted,
    not raised."""
    endpoint = MetricsEndpoint()
    endpoint.granted(0, (), 1.0)  # type: ignore[arg-type]  # a request it cannot size
    endpoint.delivered([None])  # type: ignore[list-item]  # not a (client, message) pair
    assert endpoint.failures == 2
    assert endpoint.waits == {}
    endpoint.granted(0, (1, 1, "mib"), 2.0)
    assert endpoint.waits["memory"].count == 1
