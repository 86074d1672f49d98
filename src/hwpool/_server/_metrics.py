"""``hwpool serve --metrics-port``: the server's state in the Prometheus text format.

Everything runs in the server's one event-loop thread:

- **Counting** between scrapes: each grant's wait, by size class (:meth:`MetricsEndpoint.granted`,
  called by the state on every grant), and each revocation by reason
  (:meth:`MetricsEndpoint.delivered`, called with what the loop sends).
- **Serving** a scrape: the port (``_metrics_http``: no thread per connection, a connection
  cap, timeouts, a request-size bound) asks :meth:`MetricsEndpoint.render`, which takes a
  :class:`Snapshot` (in the loop: every value of the same moment) and turns it into metric
  families (:func:`families`, pure) and text. A rendering is reused for scrapes within
  :data:`RENDER_INTERVAL_S`, so that scraping in a loop cannot keep the server's loop busy.

**Aggregates only.** Anyone on the machine can reach a TCP port, members of the server's
group or not, so the families say nothing of any user's jobs: no user name, uid, pid,
account, lease, job name or command, and no series per user or per lease. They count GPUs,
free and leased capacity, the queue's length and sizes, waits and revocations. The
per-user view (who holds and waits for what) is ``hwpool status --json`` over the server's
socket, which only its members reach (docs/security.md).

Memory is exported in bytes and utilisation as a ratio (Prometheus' base units). The live GPU
fields of a watching server (``gpu_state``, ``outside``; see docs/observability.md) are
exported when the status has them, and left out when it has not. This module imports
prometheus-client (for the families and the text): the server imports it only when metrics
are asked for.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from .._core._explain import Reason
from .._host._detect import GPUInfo
from .._wire._protocol import Revoked, ServerMessage, StatusReply
from ._config import Owner
from ._defaults import METRICS_MAX_CONNECTIONS, METRICS_TIMEOUT_S
from ._listen import ServeError
from ._metrics_http import MetricsListener, listen

__all__ = [
    "WAIT_BUCKETS",
    "MetricsEndpoint",
    "Snapshot",
    "families",
    "size_class",
]

MIB = 1 << 20
RENDER_INTERVAL_S = 1.0
"""A scrape this soon after the last rendering gets that rendering again."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text format prometheus-client's ``generate_latest`` writes."""
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0,
                12 * 3600.0)  # fmt: skip
"""Upper bounds (seconds) of the wait histogram's buckets (+Inf is added)."""


@dataclass(frozen=True)
class ServerView:
    """What the metrics read of the running server: its loop, a function that gives its
    whole status now (called in the loop only), its GPUs, their sizes in MiB (None: it shares
    fractions) and what a whole GPU is in units."""

    loop: asyncio.AbstractEventLoop
    status_now: Callable[[], StatusReply]
    gpus: tuple[GPUInfo, ...]
    totals: tuple[int, ...] | None
    units_per_gpu: int


# ----------------------------------------------------------------- labels
def size_class(count: int, units: int, unit: str, units_per_gpu: int) -> str:
    """A request's size, in few enough classes to be a label: ``fraction`` (part of one GPU),
    ``memory`` (MiB of one GPU), ``1gpu``, ``2gpus``, ``3-4gpus``, ``5-8gpus``, ``9+gpus``."""
    if unit == "mib":
        return "memory"
    if count <= 1:
        return "1gpu" if units >= units_per_gpu else "fraction"
    if count == 2:
        return "2gpus"
    return "3-4gpus" if count <= 4 else "5-8gpus" if count <= 8 else "9+gpus"


# ----------------------------------------------------------------- what the loop counts
@dataclass
class WaitCounts:
    """One histogram series: counts per bucket (not cumulative), the sum and the count."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    total_s: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(WAIT_BUCKETS, seconds)] += 1
        self.total_s += seconds
        self.count += 1

    def copy(self) -> WaitCounts:
        return WaitCounts(list(self.buckets), self.total_s, self.count)


@dataclass(frozen=True)
class Snapshot:
    """The server at one moment, taken in its loop: the status as sent on the wire (every
    lease and waiter, as an admin sees them: the families keep only aggregates of it), the
    GPUs, and what was counted since start (waits by size class, revocations by reason)."""

    status: Mapping[str, Any]
    gpus: tuple[GPUInfo, ...]
    totals: tuple[int, ...] | None
    units_per_gpu: int
    waits: Mapping[str, WaitCounts]
    revocations: Mapping[str, int]
    failures: int = 0
    refused: int = 0  # connections to the port closed at once, the cap being reached


class MetricsEndpoint:
    """The port and the loop's counts: :meth:`start` it (it listens) before the loop runs,
    :meth:`attach` the server in its running loop (it serves), :meth:`stop` it at the end."""

    def __init__(self) -> None:
        self.server: ServerView | None = None
        self.waits: dict[str, WaitCounts] = {}
        self.revocations: dict[str, int] = {}
        self.failures = 0  # errors of ours while counting, in the loop (none expected)
        self.listener: MetricsListener | None = None
        self.address: tuple[str, int] = ("", 0)
        self.rendered: tuple[float, bytes] | None = None  # (monotonic time, text)

    @classmethod
    def start(
        cls, host: str, port: int, max_connections: int = METRICS_MAX_CONNECTIONS,
        timeout_s: float = METRICS_TIMEOUT_S,
    ) -> MetricsEndpoint:  # fmt: skip
        """Listen on ``host``:``port`` (0: any free port); ServeError if it cannot. At most
        ``max_connections`` are served at once, each for ``timeout_s`` at most per step."""
        endpoint = cls()
        try:
            sock = listen(host, port)
        except OSError as exc:
            raise ServeError(
                f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from None
        endpoint.listener = MetricsListener(sock, endpoint.render, max_connections, timeout_s)
        endpoint.address = (host, int(sock.getsockname()[1]))
        return endpoint

    @property
    def said(self) -> str:
        """Where it listens and its bounds, for the log."""
        if self.listener is None:
            return self.url
        return (
            f"{self.url} (aggregates only; at most {self.listener.max_connections} "
            f"connections at once, {self.listener.timeout_s:g} s each to ask and to read)"
        )

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def attach(self, server: ServerView) -> None:
        """Count for ``server`` and serve its metrics in its loop (the running one)."""
        self.server = server
        if self.listener is not None:
            self.listener.start(server.loop)

    def stop(self) -> None:
        """Stop serving, in the loop or after it has ended (idempotent)."""
        self.server = None
        if self.listener is not None:
            self.listener.stop()

    # ------------------------------------------------------------- called in the loop
    def granted(self, owner: Owner, request: tuple[int, int, str], waited_s: float) -> None:
        """A grant of ``request`` (count, units, unit) after ``waited_s`` (to ``owner``, who
        is not counted: the metrics name no one). A failure here is counted
        (``hwpool_metrics_failures_total``), never passed on to the grant that called it."""
        try:
            self._count_grant(request, waited_s)
        except Exception:
            self.failures += 1

    def _count_grant(self, request: tuple[int, int, str], waited_s: float) -> None:
        units_per_gpu = self.server.units_per_gpu if self.server is not None else 1
        key = size_class(*request, units_per_gpu)
        counts = self.waits.get(key)
        if counts is None:
            counts = self.waits[key] = WaitCounts()
        counts.observe(max(waited_s, 0.0))

    def delivered(self, deliveries: Iterable[tuple[object, ServerMessage]]) -> None:
        """Count the revocations among what the loop sends, by reason (never failing the
        sending: a failure is counted)."""
        try:
            for _, message in deliveries:
                if isinstance(message, Revoked):
                    reason = message.reason
                    self.revocations[reason] = self.revocations.get(reason, 0) + 1
        except Exception:
            self.failures += 1

    def snapshot_in_loop(self) -> Snapshot:
        """The snapshot (in the loop thread: nothing changes while it is taken)."""
        server = self.server
        if server is None:
            raise RuntimeError("the server is not running")
        return Snapshot(
            server.status_now().wire(), server.gpus, server.totals, server.units_per_gpu,
            {k: v.copy() for k, v in self.waits.items()}, dict(self.revocations),
            self.failures, 0 if self.listener is None else self.listener.over_cap,
        )  # fmt: skip

    def render(self) -> tuple[str, bytes]:
        """The text of a scrape (in the loop): rendered anew at most once per
        RENDER_INTERVAL_S; an error raises (that scrape fails, the server goes on)."""
        now = time.monotonic()
        if self.rendered is not None and now - self.rendered[0] < RENDER_INTERVAL_S:
            return CONTENT_TYPE, self.rendered[1]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(families(self.snapshot_in_loop())))
        text = generate_latest(registry)
        self.rendered = (now, text)
        return CONTENT_TYPE, text


class _Collector(Collector):
    """prometheus-client's view of one snapshot's families."""

    def __init__(self, found: list[Metric]) -> None:
        self.found = found

    def collect(self) -> list[Metric]:
        return self.found


# ----------------------------------------------------------------- the families (pure)
def families(snap: Snapshot) -> list[Metric]:
    """Every metric family of ``snap``."""
    return [
        *_server_families(snap),
        *_gpu_families(snap),
        *_lease_families(snap),
        *_queue_families(snap),
        *_watch_families(snap),
    ]


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _server_families(snap: Snapshot) -> list[Metric]:
    status = snap.status
    journal_error = status.get("journal_error")
    counters: list[Metric] = [
        CounterMetricFamily(f"hwpool_{name}", text, value=status[key])
        for name, key, text in (
            ("grants", "granted", "Leases granted (journaled: across restarts)."),
            ("releases", "released", "Leases released, revoked or freed with their client."),
            ("cancellations", "cancelled", "Waiting requests cancelled or withdrawn."),
            ("timeouts", "timed_out", "Waiting requests that timed out."),
        )
    ]
    revoked = CounterMetricFamily(
        "hwpool_revocations", "Leases revoked since this server started, by reason "
        "(cancel: hwpool cancel; limit: its time limit ran out).", labels=["reason"],
    )  # fmt: skip
    for reason in sorted({"cancel", "limit", *snap.revocations}):
        revoked.add_metric([reason], snap.revocations.get(reason, 0))
    failures = CounterMetricFamily(
        "hwpool_metrics_failures", "Errors of the metrics themselves while counting grants "
        "and revocations (none expected; the server goes on).", value=snap.failures,
    )  # fmt: skip
    refused = CounterMetricFamily(
        "hwpool_metrics_connections_refused", "Connections to this port closed at once "
        "because the most allowed at once were open (--metrics-max-connections).",
        value=snap.refused,
    )  # fmt: skip
    return [
        failures,
        refused,
        _gauge("hwpool_uptime_seconds", "Seconds since this server started.", status["uptime_s"]),
        _gauge(
            "hwpool_journal_ok",
            "1 while the journal is written; 0 while it cannot be (then nothing new is granted).",
            0 if journal_error else 1,
        ),
        _gauge(
            "hwpool_recovering_seconds",
            "Seconds left of the grace period after a restart (0: serving).",
            status["recovering_s"],
        ),
        *counters,
        revoked,
    ]


def _gpu_families(snap: Snapshot) -> list[Metric]:
    """Capacity and what is free, per GPU: a fraction of it, and bytes on a server sized in
    memory."""
    gpus = GaugeMetricFamily("hwpool_gpus", "GPUs this server shares.", value=len(snap.gpus))
    free = GaugeMetricFamily(
        "hwpool_gpu_free_ratio", "Share of each GPU not leased (0..1).", labels=["gpu"]
    )
    free_bytes = GaugeMetricFamily(
        "hwpool_gpu_free_bytes", "Memory of each GPU not leased (a server sized in memory).",
        labels=["gpu"],
    )  # fmt: skip
    capacity = GaugeMetricFamily(
        "hwpool_gpu_capacity_bytes", "Memory each GPU shares out (a server sized in memory).",
        labels=["gpu"],
    )  # fmt: skip
    for gpu, units in zip(snap.gpus, snap.status["free"], strict=False):
        whole = snap.units_per_gpu if snap.totals is None else snap.totals[gpu.index]
        free.add_metric([str(gpu.index)], units / whole if whole else 0.0)
        if snap.totals is not None:
            free_bytes.add_metric([str(gpu.index)], units * MIB)
            capacity.add_metric([str(gpu.index)], snap.totals[gpu.index] * MIB)
    out: list[Metric] = [gpus, free]
    return [*out, free_bytes, capacity] if snap.totals is not None else out


def _lease_families(snap: Snapshot) -> list[Metric]:
    """Leases held now, and how many use more memory than leased (a watching server); no
    series per lease: that would name its holder's jobs."""
    leases = snap.status["leases"]
    out: list[Metric] = [_gauge("hwpool_leases", "Leases held now.", len(leases))]
    if snap.status.get("gpu_state") is not None:
        over = sum(bool(lease.get("over_lease")) for lease in leases)
        out.append(_gauge("hwpool_leases_over", "Leases using more memory than leased.", over))
    return out


def _queue_families(snap: Snapshot) -> list[Metric]:
    """The queue now (length, per size class, the oldest wait), and the waits of the
    requests granted since this server started (a histogram per size class): no series per
    owner, so that the queue's users stay unnamed."""
    waiting = snap.status["waiting"]
    per: dict[str, int] = {}
    for waiter in waiting:
        size = size_class(waiter["count"], waiter["units"], waiter.get("unit", "gpu"),
                          snap.units_per_gpu)  # fmt: skip
        per[size] = per.get(size, 0) + 1
    queued = GaugeMetricFamily(
        "hwpool_queue_requests", "Requests waiting now, per size class.", labels=["size"]
    )
    for size, n in sorted(per.items()):
        queued.add_metric([size], n)
    oldest = max((w["age_s"] for w in waiting), default=0.0)
    return [
        _gauge("hwpool_queue_length", "Requests waiting now.", len(waiting)),
        queued,
        _reason_gauge(waiting),
        _gauge(
            "hwpool_queue_oldest_wait_seconds",
            "How long the longest-waiting request has waited (0: none waits).",
            oldest,
        ),
        _wait_histogram(snap.waits),
    ]


def _reason_gauge(waiting: Sequence[Mapping[str, Any]]) -> GaugeMetricFamily:
    """Requests waiting now per reason (docs/scheduling.md): every reason the core knows,
    0 where none waits for it, so that a series never vanishes."""
    per = dict.fromkeys((reason.value for reason in Reason), 0)
    for waiter in waiting:
        reason = waiter.get("reason")
        if isinstance(reason, str) and reason in per:
            per[reason] += 1
    family = GaugeMetricFamily(
        "hwpool_queue_reason_requests", "Requests waiting now, per reason.", labels=["reason"]
    )
    for reason, n in per.items():
        family.add_metric([reason], n)
    return family


def _wait_histogram(waits: Mapping[str, WaitCounts]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        "hwpool_wait_seconds", "How long each request granted since this server started "
        "waited (0 for one granted at once), per size class.", labels=["size"],
    )  # fmt: skip
    for size, counts in sorted(waits.items()):
        family.add_metric([size], _cumulative(counts), counts.total_s)
    return family


def _cumulative(counts: WaitCounts) -> list[tuple[str, float]]:
    """The buckets as Prometheus has them: cumulative, ``+Inf`` last."""
    bounds = [*(f"{b:g}" for b in WAIT_BUCKETS), "+Inf"]
    running, out = 0, []
    for bound, n in zip(bounds, counts.buckets, strict=True):
        running += n
        out.append((bound, float(running)))
    return out


def _watch_families(snap: Snapshot) -> list[Metric]:
    """Where the server watches its GPUs: memory and utilisation per GPU, memory withheld
    from the queue, processes outside it."""
    states: Sequence[Mapping[str, Any]] | None = snap.status.get("gpu_state")
    if states is None:
        return []
    gauges = {
        "used_mib": ("hwpool_gpu_memory_used_bytes", "Memory in use on each GPU, by anyone.",
                     MIB),
        "total_mib": ("hwpool_gpu_memory_total_bytes", "Each GPU's memory.", MIB),
        "utilization": ("hwpool_gpu_utilization_ratio", "Share of the driver's last sample "
                        "period a kernel ran on each GPU (0..1).", 0.01),
        "withheld_mib": ("hwpool_gpu_withheld_bytes", "Memory outside the queue taken out of "
                         "what each GPU shares.", MIB),
    }  # fmt: skip
    out: list[Metric] = []
    for key, (name, text, scale) in gauges.items():
        family = GaugeMetricFamily(name, text, labels=["gpu"])
        for state in states:
            if state.get(key) is not None:
                family.add_metric([str(state["gpu"])], state[key] * scale)
        out.append(family)
    outside = snap.status.get("outside") or []
    count = len(outside) + int(snap.status.get("outside_left_out") or 0)
    out.append(_gauge("hwpool_outside_processes", "Processes on a GPU outside the queue.", count))
    per_gpu: dict[int, int] = {}
    for proc in outside:
        per_gpu[proc["gpu"]] = per_gpu.get(proc["gpu"], 0) + int(proc.get("used_mib") or 0)
    memory = GaugeMetricFamily(
        "hwpool_outside_memory_bytes", "Memory the processes outside the queue use, per GPU "
        "(of those listed).", labels=["gpu"],
    )  # fmt: skip
    for gpu, mib in sorted(per_gpu.items()):
        memory.add_metric([str(gpu)], mib * MIB)
    out.append(memory)
    out.append(CounterMetricFamily(
        "hwpool_leases_ended_for_overuse", "Leases ended for using more than leased (policy "
        "term) since this server started.", value=int(snap.status.get("ended_for_overuse") or 0),
    ))  # fmt: skip
    return out
