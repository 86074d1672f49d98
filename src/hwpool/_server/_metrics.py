"""``hwpool serve --metrics-port``: the server's state in the Prometheus text format.

Two threads, nothing shared but what is handed over:

- **The loop** (the server's one event-loop thread) counts what happens between scrapes:
  each grant's wait, by owner and size class (:meth:`MetricsEndpoint.granted`, called by the
  state on every grant), and each revocation by reason (:meth:`MetricsEndpoint.delivered`,
  called with what the loop sends). Plain dicts: the loop alone writes them.
- **The HTTP thread** (prometheus-client's server) answers ``GET /metrics``: it asks the loop
  for a :class:`Snapshot` (``call_soon_threadsafe``; built in the loop in one step, so every
  value is of the same moment) and turns it into metric families (:func:`families`, pure).
  A scrape never blocks the loop; a loop too busy to answer within ``SNAPSHOT_TIMEOUT_S``
  fails that scrape (HTTP 500), not the server.

Memory is exported in bytes and utilisation as a ratio (Prometheus' base units). The live GPU
fields of a watching server (``gpu_state``, ``outside``, a lease's ``used_mib``; see
docs/observability.md) are exported when the status has them, and left out when it has not.
This module imports prometheus-client: the server imports it only when metrics are asked for.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import pwd
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector, CollectorRegistry

from .._host._detect import GPUInfo
from .._wire._protocol import Revoked, ServerMessage, StatusReply
from ._config import Owner
from ._listen import ServeError

__all__ = [
    "WAIT_BUCKETS",
    "MetricsEndpoint",
    "Snapshot",
    "families",
    "owner_label",
    "size_class",
]

MIB = 1 << 20
SNAPSHOT_TIMEOUT_S = 5.0
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


def owner_label(uid: int | None, account: str | None, names: dict[int, str]) -> str:
    """An owner as a label value: ``account:ml`` for an account (no user name has a colon),
    else the user's name (its uid where it has none); ``names`` caches the look-ups."""
    if account is not None:
        return f"account:{account}"
    if uid is None:
        return "unknown"
    name = names.get(uid)
    if name is None:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        names[uid] = name
    return name


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
    lease and waiter, as an admin sees them), the GPUs, and what was counted since start."""

    status: Mapping[str, Any]
    gpus: tuple[GPUInfo, ...]
    totals: tuple[int, ...] | None
    units_per_gpu: int
    waits: Mapping[tuple[str, str], WaitCounts]
    revocations: Mapping[str, int]
    names: Mapping[int, str]
    failures: int = 0


class MetricsEndpoint:
    """The HTTP endpoint and the loop's counts; :meth:`start` it before the loop runs,
    :meth:`attach` the server once its loop does, :meth:`stop` it at the end."""

    def __init__(self) -> None:
        self.server: ServerView | None = None
        self.waits: dict[tuple[str, str], WaitCounts] = {}
        self.revocations: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.failures = 0  # errors of ours while counting, in the loop (none expected)
        self.httpd: Any = None
        self.address: tuple[str, int] = ("", 0)

    @classmethod
    def start(cls, host: str, port: int) -> MetricsEndpoint:
        """Listen on ``host``:``port`` (0: any free port); ServeError if it cannot."""
        endpoint = cls()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(endpoint))
        try:
            endpoint.httpd, _ = start_http_server(port, host, registry=registry)
        except OSError as exc:
            raise ServeError(
                f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from None
        endpoint.address = (host, int(endpoint.httpd.server_address[1]))
        return endpoint

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def attach(self, server: ServerView) -> None:
        self.server = server

    def stop(self) -> None:
        """Stop answering (from any thread but the HTTP one)."""
        self.server = None
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    # ------------------------------------------------------------- called in the loop
    def granted(self, owner: Owner, request: tuple[int, int, str], waited_s: float) -> None:
        """A grant to ``owner`` of ``request`` (count, units, unit) after ``waited_s``. A
        failure here is counted (``hwpool_metrics_failures_total``), never passed on to the
        grant that called it."""
        try:
            self._count_grant(owner, request, waited_s)
        except Exception:
            self.failures += 1

    def _count_grant(self, owner: Owner, request: tuple[int, int, str], waited_s: float) -> None:
        units_per_gpu = self.server.units_per_gpu if self.server is not None else 1
        label = owner_label(
            owner if isinstance(owner, int) else None,
            owner if isinstance(owner, str) else None, self.names,
        )  # fmt: skip
        key = (label, size_class(*request, units_per_gpu))
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
        assert server is not None
        return Snapshot(
            server.status_now().wire(), server.gpus, server.totals, server.units_per_gpu,
            {k: v.copy() for k, v in self.waits.items()}, dict(self.revocations),
            dict(self.names), self.failures,
        )  # fmt: skip

    # ------------------------------------------------------------- called in the HTTP thread
    def snapshot(self) -> Snapshot:
        """Ask the loop for a snapshot and wait for it (bounded); RuntimeError if the
        server is not running or does not answer in time."""
        server = self.server
        if server is None or server.loop.is_closed():
            raise RuntimeError("the server is not running")
        loop = server.loop
        result: concurrent.futures.Future[Snapshot] = concurrent.futures.Future()

        def take() -> None:
            try:
                result.set_result(self.snapshot_in_loop())
            except Exception as exc:  # a bug of ours: this scrape fails, the server goes on
                result.set_exception(exc)

        loop.call_soon_threadsafe(take)
        return result.result(SNAPSHOT_TIMEOUT_S)


class _Collector(Collector):
    """prometheus-client's view of the endpoint: one snapshot per scrape."""

    def __init__(self, endpoint: MetricsEndpoint) -> None:
        self.endpoint = endpoint

    def collect(self) -> Iterator[Metric]:
        yield from families(self.endpoint.snapshot())


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
    return [
        failures,
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
    """Leases held now; each lease's memory in use where the server watches its GPUs."""
    leases = snap.status["leases"]
    used = GaugeMetricFamily(
        "hwpool_lease_memory_used_bytes", "GPU memory the processes of each lease use, over "
        "its GPUs (a server that watches its GPUs).", labels=["lease", "owner"],
    )  # fmt: skip
    over = 0
    for lease in leases:
        if lease.get("used_mib") is not None:
            owner = owner_label(lease["uid"], None, dict(snap.names))
            used.add_metric([str(lease["id"]), owner], lease["used_mib"] * MIB)
        over += bool(lease.get("over_lease"))
    out: list[Metric] = [_gauge("hwpool_leases", "Leases held now.", len(leases))]
    if any("used_mib" in lease for lease in leases):
        out.append(used)
    if snap.status.get("gpu_state") is not None:
        out.append(_gauge("hwpool_leases_over", "Leases using more memory than leased.", over))
    return out


def _queue_families(snap: Snapshot) -> list[Metric]:
    """The queue now (length, per owner and size class, the oldest wait), and the waits of
    the requests granted since this server started (a histogram per owner and size)."""
    waiting = snap.status["waiting"]
    names = dict(snap.names)
    per: dict[tuple[str, str], int] = {}
    for waiter in waiting:
        key = (
            owner_label(waiter["uid"], waiter.get("account"), names),
            size_class(waiter["count"], waiter["units"], waiter.get("unit", "gpu"),
                       snap.units_per_gpu),
        )  # fmt: skip
        per[key] = per.get(key, 0) + 1
    queued = GaugeMetricFamily(
        "hwpool_queue_requests", "Requests waiting now, per owner and size class.",
        labels=["owner", "size"],
    )  # fmt: skip
    for (owner, size), n in sorted(per.items()):
        queued.add_metric([owner, size], n)
    oldest = max((w["age_s"] for w in waiting), default=0.0)
    return [
        _gauge("hwpool_queue_length", "Requests waiting now.", len(waiting)),
        queued,
        _gauge(
            "hwpool_queue_oldest_wait_seconds",
            "How long the longest-waiting request has waited (0: none waits).",
            oldest,
        ),
        _wait_histogram(snap.waits),
    ]


def _wait_histogram(waits: Mapping[tuple[str, str], WaitCounts]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        "hwpool_wait_seconds", "How long each request granted since this server started "
        "waited (0 for one granted at once), per owner and size class.",
        labels=["owner", "size"],
    )  # fmt: skip
    for (owner, size), counts in sorted(waits.items()):
        family.add_metric([owner, size], _cumulative(counts), counts.total_s)
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
