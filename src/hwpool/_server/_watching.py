"""The server's side of the GPU watcher (:mod:`hwpool._watch`): the periodic sample, memory
used outside the queue withheld from what is shared, and leases over their memory.

Every ``interval_s`` the loop takes a view of the leases held (on its own thread: the state
is the loop's), hands it to :meth:`~hwpool._watch.Watcher.observe` on a thread of its own (a
sample blocks on NVML or on nvidia-smi) and applies what it found back on the loop: never
two samples at once, and the next one is timed from the end of the last. What it applies:

- per GPU, the memory outside the queue (after the watcher's hysteresis) is withheld in the
  core (:meth:`HostState.withhold`): on a server sized in memory, less what ``--reserve-in-use``
  already left out at start; on a server that shares fractions, as the fraction of the GPU's
  memory it is (rounded up);
- per lease flagged over its memory: the log and, for a client whose hello said ``notices``,
  a ``notice`` message (``hwpool run`` and a job's launcher print it on the job's stderr); with
  the policy ``term``, once over for the grace: the lease ended (``revoked``, reason
  ``overuse``) and SIGTERM to its job's process group, where that group is proven to be the
  lease's (:mod:`hwpool._watch._proof`); where none is, nothing is signalled and nothing
  ended: the log and the notice say why (warn only).

A lease's processes are found from its holder only while the holder is still the process
that connected (its pid, start time and uid as the server read them when it accepted the
connection): a pid the kernel gave to another process after the holder ended is nobody's
lease. A revoked lease whose GPUs are still held counts its processes too (as its own, not
outside the queue), but is not checked against any allowance.

Nothing here is journaled: a restarted server samples again (its hysteresis starts afresh).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import math
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import overload

from .._host._detect import GPUInfo
from .._host._procs import is_process
from .._host._signal import signal_process
from .._watch import (
    Attributed,
    LeaseProcs,
    LeaseShare,
    OverUse,
    ProcFS,
    Sampler,
    Watcher,
    WatchReport,
    open_sampler,
    parse_policy,
)
from .._watch._procfs import namespace_note
from .._watch._proof import JobGroup, job_group
from .._wire._protocol import (
    MAX_OUTSIDE,
    GPUStateRecord,
    LeaseRecord,
    Notice,
    OutsideRecord,
    StatusReply,
    WatchRecord,
)
from ._config import Owner
from ._host_entries import Delivery, Entry
from ._host_state import HostState

__all__ = ["Watching", "watch_refusal"]


def watch_refusal(gpus: Sequence[GPUInfo], interval_s: float) -> str | None:
    """Why the server does not watch its GPUs (for its log), or None where it does: turned
    off, or logical GPUs without UUIDs (``--gpus N``, ``--gpu-memory``: no device to read)."""
    if interval_s <= 0:
        return "the GPUs are not watched (watch_interval off)"
    if not any(gpu.uuid for gpu in gpus):
        return "the GPUs are not watched (logical GPUs, without UUIDs)"
    return None


class Watching:
    """The periodic watch step of one server; see the module docstring.

    ``state``: the server's :class:`HostState`; ``gpus``: its GPUs (those with a UUID are
    watched); ``say`` logs a line; ``after`` sends deliveries once the turn's changes are
    journaled (as every change of the state). ``opener`` opens the sampler (tests inject one).
    """

    def __init__(
        self,
        state: HostState,
        gpus: Sequence[GPUInfo],
        *,
        interval_s: float,
        policy: str,
        owner_policies: Mapping[Owner, str],
        grace_s: float,
        say: Callable[[str], None],
        after: Callable[[list[Delivery]], None],
        opener: Callable[[], tuple[Sampler, str]] = open_sampler,
    ) -> None:
        self.state = state
        self.interval_s = interval_s
        self.policy = parse_policy(policy)
        self.owner_policies = {owner: parse_policy(p) for owner, p in owner_policies.items()}
        self.grace_s = grace_s
        self.say = say
        self.after = after
        self._opener = opener
        self._uuids = {gpu.index: gpu.uuid for gpu in gpus if gpu.uuid}
        self._gpu_of = {uuid: index for index, uuid in self._uuids.items()}
        self._reserved_mib = _reserved_at_start(gpus, state.totals)
        self._withheld_units = [0] * len(gpus)
        self._procs = ProcFS()
        self._watcher: Watcher | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.Handle | None = None
        self._busy = False  # a sample is being taken
        self._stopped = False
        self.source = ""  # "nvml" or "nvidia-smi", once the sampler is open
        self.report: WatchReport | None = None
        self.report_at: float | None = None  # time.monotonic() when it was taken
        self._problem = ""
        self._over: dict[int, list[OverUse]] = {}  # lease id -> its flags at the last sample
        self.ended_for_overuse = 0
        self._to_terminate: list[JobGroup] = []  # job groups to SIGTERM after this flush
        self._unproven: set[int] = set()  # leases whose holder was said to be unproven
        self.samples = 0

    # ----------------------------------------------------------------- the loop
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the first sample now, then one every ``interval_s``."""
        self._loop = loop
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "hwpool-watch")
        self._timer = loop.call_soon(self.step)

    def step(self) -> None:
        """Take the lease view here (the loop's thread) and sample on the watch thread."""
        self._timer = None
        if self._stopped or self._busy or self._loop is None or self._executor is None:
            return
        try:
            procs, shares = self.lease_view()
        except Exception:  # a bug of ours: say so, and try again next time
            self.say("internal error in the GPU watch:\n" + traceback.format_exc().rstrip())
            self._timer = self._loop.call_later(self.interval_s, self.step)
            return
        self._busy = True
        future = self._executor.submit(self._observe, procs, shares)
        asyncio.wrap_future(future, loop=self._loop).add_done_callback(self._sampled)

    def _observe(
        self, procs: list[LeaseProcs], shares: list[LeaseShare]
    ) -> tuple[WatchReport, str]:
        """One watcher step, on the watch thread; and, on the first (which opens the
        sampler), how it samples, in words, for the log (written on the loop's thread)."""
        opened = ""
        if self._watcher is None:
            sampler, opened = self._opener()
            opened = "; ".join(filter(None, (opened, namespace_note())))
            self._watcher = Watcher(sampler, grace_s=self.grace_s)
        return self._watcher.observe(procs, shares, time.monotonic()), opened

    def _sampled(self, future: asyncio.Future[tuple[WatchReport, str]]) -> None:
        """Back on the loop: apply the report, and time the next sample from now."""
        self._busy = False
        if self._stopped or future.cancelled():
            return
        try:
            report, opened = future.result()
            if opened:
                self.say(opened)
                self.source = report.sample.source
            self.apply(report, time.monotonic())
        except Exception:  # a bug of ours: the server goes on, and so does the watch
            self.say("internal error in the GPU watch:\n" + traceback.format_exc().rstrip())
        if self._loop is not None and not self._stopped:
            self._timer = self._loop.call_later(self.interval_s, self.step)

    def stop(self) -> None:
        """Sample no more: cancel the next step, close the sampler on the watch thread after
        any sample under way, and let that thread end (not waited for: a sample through
        nvidia-smi may take its timeout)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._executor is not None:
            self._executor.submit(self._close)
            self._executor.shutdown(wait=False)
            self._executor = None

    def _close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()

    # ----------------------------------------------------------------- the view
    def lease_view(self) -> tuple[list[LeaseProcs], list[LeaseShare]]:
        """Per lease held now (and revoked lease still held): its holder's processes (the
        client's pid, which ``hwpool run``'s job and a launcher's job descend from; the pid's
        group and session where the pid leads them, and only then: a group or session it
        shares may hold anything), none where the holder is not proven (see the module), and
        its share on each of its GPUs that has a UUID."""
        procs = [self._procs_of(entry) for entry in self.state.revoked_leases()]
        shares: list[LeaseShare] = []
        for entry in self.state.held_leases():
            assert entry.held is not None
            procs.append(self._procs_of(entry))
            policy = self.policy_of(entry)
            for gpu, units in entry.held.items():
                if gpu in self._uuids:
                    shares.append(self._share(entry.id, self._uuids[gpu], units, policy))
        return procs, shares

    def _procs_of(self, entry: Entry) -> LeaseProcs:
        """What identifies ``entry``'s processes: its holder's pid, group and session, if the
        holder is proven (still the process that connected); nothing otherwise."""
        uuids = frozenset(self._uuids[g] for g in entry.held or {} if g in self._uuids)
        holder = entry.client.holder
        if holder is None or not is_process(holder):
            self._say_unproven(entry)
            return LeaseProcs(entry.id, uuids)
        pid = holder.pid
        stat = self._procs.stat(pid)
        pgid = pid if stat is not None and stat.pgid == pid else None
        sid = pid if stat is not None and stat.sid == pid else None
        return LeaseProcs(entry.id, uuids, frozenset({pid}), pgid, sid)

    def _say_unproven(self, entry: Entry) -> None:
        """Log, once per lease, that its holder is not proven."""
        if entry.id in self._unproven:
            return
        self._unproven.add(entry.id)
        self._unproven &= {e.id for e in (*self.state.held_leases(), *self.state.revoked_leases())}
        self.say(
            f"lease #{entry.id}: its holder {entry.client} is not proven (it has ended, and "
            "its pid may name another process now; or its start time was not known): no "
            "process is counted against the lease or signalled for it"
        )

    def policy_of(self, entry: Entry) -> str:
        """The over-lease policy of ``entry``'s owner (its uid or account)."""
        owner = self.state.owner_of(entry.client.uid)
        return self.owner_policies.get(owner, self.policy).value

    def _share(self, lease: int, uuid: str, units: int, policy: str) -> LeaseShare:
        """What a lease of ``units`` on a GPU may use: MiB on a server sized in memory, its
        fraction of the GPU's memory otherwise."""
        if self.state.totals is not None:
            return LeaseShare(lease, uuid, memory_mib=units, policy=policy)  # type: ignore[arg-type]
        fraction = Fraction(units, self.state.units_per_gpu)
        return LeaseShare(lease, uuid, fraction=fraction, policy=policy)  # type: ignore[arg-type]

    # ----------------------------------------------------------------- applying a report
    def apply(self, report: WatchReport, now: float) -> None:
        """Withhold what is used outside the queue, act on the over-lease flags, remember the
        report for status."""
        self.samples += 1
        self.report, self.report_at = report, now
        problem = report.sample.problem
        if problem != self._problem:
            self.say(f"GPU watch: {problem}" if problem else "GPU watch: sampling works again")
            self._problem = problem
        deliveries: list[Delivery] = []
        totals = {gpu.uuid: gpu.total_mib for gpu in report.sample.gpus}
        for index, uuid in self._uuids.items():
            mib = report.withheld_mib.get(uuid, 0)
            units = self._units(index, mib, totals.get(uuid))
            if units is not None and units != self._withheld_units[index]:
                self.say(
                    f"GPU {index}: {mib} MiB used outside the queue: withholding "
                    f"{self._said(units)} of what is shared"
                    if units
                    else f"GPU {index}: nothing used outside the queue: withholding nothing"
                )
                self._withheld_units[index] = units
                deliveries += self.state.withhold(index, units, now)
        deliveries += self._over_leases(report, now)
        self.after(deliveries)  # schedules the journal's flush, which sends them
        if self._to_terminate and self._loop is not None:
            self._loop.call_soon(_terminate, self._to_terminate)  # after that flush
        self._to_terminate = []

    def _units(self, gpu: int, mib: int, total_mib: int | None) -> int | None:
        """The core's units for ``mib`` withheld on ``gpu`` (None: cannot tell, keep as is)."""
        totals = self.state.totals
        if totals is not None:
            return max(0, min(totals[gpu], mib - self._reserved_mib[gpu]))
        if not mib:
            return 0
        if not total_mib:
            return None
        full = self.state.units_per_gpu
        return min(full, math.ceil(Fraction(mib * full, total_mib)))

    def _said(self, units: int) -> str:
        if self.state.totals is not None:
            return f"{units} MiB"
        return f"{units / self.state.units_per_gpu:.3g} of the GPU"

    def _over_leases(self, report: WatchReport, now: float) -> list[Delivery]:
        """Log, notify and end leases as their flags say."""
        over: dict[int, list[OverUse]] = {}
        deliveries: list[Delivery] = []
        for flag in report.over:
            over.setdefault(flag.lease, []).append(flag)
        self._over = over
        for lease, flags in over.items():
            entry = self.state.lease(lease)
            if entry is None:
                continue  # released while the sample was taken
            if any(f.warn for f in flags):
                deliveries += self._warn(entry, flags)
            if any(f.end for f in flags):
                deliveries += self._end(entry, report, now)
        return deliveries

    def _warn(self, entry: Entry, flags: list[OverUse]) -> list[Delivery]:
        """Say that ``entry`` is over: in the log, and to its client if it reads notices."""
        text = _over_text(entry.id, flags, self._gpu_of)
        if flags[0].policy.value == "term":
            text += f"; it is ended if it stays over for {self.grace_s:g} s"
        self.say(f"{text} (holder {entry.client})")
        if not entry.client.notices:
            return []
        return [(entry.client, Notice(entry.req, entry.id, f"hwpool: {text}"))]

    def _end(self, entry: Entry, report: WatchReport, now: float) -> list[Delivery]:
        """End ``entry`` for overuse and SIGTERM its job's process group, proven to be the
        lease's: the signals go once the ``revoked`` is written (the loop runs the journal's
        flush, scheduled by then, first), so that its client knows why its job ends. Where
        no group is proven, warn only: nothing is signalled, the lease is not ended, and the
        log and the notice say why."""
        groups, unproven = self._groups_of(entry, report.processes)
        if not groups:
            why = "; ".join(unproven) or "none of its processes is left"
            text = (
                f"lease #{entry.id} stayed over its memory for {self.grace_s:g} s but is not "
                f"ended and nothing is signalled (warn only): {why}; hwpool signals only "
                "processes it has proven belong to the lease"
            )
            self.say(f"{text} (holder {entry.client})")
            notice = Notice(entry.req, entry.id, f"hwpool: {text}")
            return [(entry.client, notice)] if entry.client.notices else []
        self._to_terminate += groups
        self.ended_for_overuse += 1
        signalled = ", ".join(str(g.pgid) for g in groups)
        also = f"; not signalled: {'; '.join(unproven)}" if unproven else ""
        self.say(
            f"lease #{entry.id} ended for overuse after {self.grace_s:g} s over its memory "
            f"(SIGTERM to its job's process group {signalled}{also})"
        )
        return self.state.end_for_overuse(entry, os.getuid(), now)

    def _groups_of(
        self, entry: Entry, processes: Sequence[Attributed]
    ) -> tuple[list[JobGroup], list[str]]:
        """The job groups of ``entry``'s GPU processes proven to be the lease's, and why the
        others are not (never this server's own group)."""
        groups: dict[int, JobGroup] = {}
        unproven: list[str] = []
        own = os.getpgrp()
        for item in processes:
            if item.lease != entry.id:
                continue
            found = job_group(entry.client.holder, item.process.pid, self._procs)
            if isinstance(found, str):
                unproven += [] if found in unproven else [found]
            elif found.pgid != own:
                groups[found.pgid] = found
        return [groups[g] for g in sorted(groups)], unproven

    # ----------------------------------------------------------------- status
    def decorate(self, reply: StatusReply, now: float) -> StatusReply:
        """``reply`` with the watcher's fields (docs/observability.md)."""
        report = self.report
        age = None if self.report_at is None else max(0.0, now - self.report_at)
        watch = WatchRecord(self.source, self.interval_s, age, self._problem)
        if report is None:
            return dataclasses.replace(reply, watch=watch)
        readings = {gpu.uuid: gpu for gpu in report.sample.gpus}
        withheld, gpu_of = report.withheld_mib, self._gpu_of
        gpu_state = tuple(
            GPUStateRecord(index, uuid, *_reading(readings.get(uuid)), withheld.get(uuid, 0))
            for index, uuid in sorted(self._uuids.items())
        )
        outside = sorted(report.outside, key=lambda a: (-(a.process.used_mib or 0), a.process.pid))
        records = tuple(
            OutsideRecord(a.process.pid, a.uid, a.user, gpu_of[a.process.gpu], a.process.used_mib)
            for a in outside[:MAX_OUTSIDE]
            if a.process.gpu in gpu_of
        )
        uses = _uses(report.processes)
        unread = frozenset(  # GPUs whose processes are unknown: their leases' use is too
            index
            for index, uuid in self._uuids.items()
            if (reading := readings.get(uuid)) is None or reading.processes is None
        )
        leases = _Decorated(reply.leases, uses, self._over, unread)
        return dataclasses.replace(
            reply, leases=leases, watch=watch, gpu_state=gpu_state, outside=records,
            outside_left_out=max(0, len(outside) - MAX_OUTSIDE),
            ended_for_overuse=self.ended_for_overuse,
        )  # fmt: skip


def _terminate(groups: Sequence[JobGroup]) -> None:
    """SIGTERM every member of each of ``groups``, each only while it is still the process
    that was proven (the same pid, start time and uid: see :func:`signal_process`)."""
    for group in groups:
        for member in group.members:
            signal_process(member, signal.SIGTERM)


def _reading(reading: object) -> tuple[int | None, int | None, int | None]:
    """Total, used and utilisation of a GPU's reading (all None if the sample lacks it)."""
    if reading is None:
        return None, None, None
    return (
        getattr(reading, "total_mib", None),
        getattr(reading, "used_mib", None),
        getattr(reading, "utilization", None),
    )


def _uses(processes: Sequence[Attributed]) -> dict[int, int | None]:
    """Per lease, the memory its GPU processes hold (None: some of it unknown)."""
    uses: dict[int, int | None] = {}
    for item in processes:
        if item.lease is None:
            continue
        before, mib = uses.get(item.lease, 0), item.process.used_mib
        uses[item.lease] = None if before is None or mib is None else before + mib
    return uses


def _over_text(lease: int, flags: list[OverUse], gpu_of: Mapping[str, int]) -> str:
    """``lease #12 uses 9000 MiB of GPU 0, more than its 4096 MiB``."""
    parts = ", ".join(
        f"{f.used_mib} MiB of GPU {gpu_of.get(f.gpu, f.gpu)}, more than its {f.allowed_mib} MiB"
        for f in flags
    )
    return f"lease #{lease} uses {parts}"


def _reserved_at_start(gpus: Sequence[GPUInfo], totals: Sequence[int] | None) -> list[int]:
    """Per GPU, the MiB ``--reserve-in-use`` left out of what is shared at start (its memory
    less its total): memory outside the queue up to that much is withheld already."""
    if totals is None:
        return [0] * len(gpus)
    return [
        max(0, gpu.memory_mib - total) if gpu.memory_mib is not None else 0
        for gpu, total in zip(gpus, totals, strict=True)
    ]


class _Decorated(Sequence[LeaseRecord]):
    """The lease records of a status reply with what the watcher saw of each, added as they
    are read (the records are built lazily, a line at a time)."""

    __slots__ = ("_leases", "_over", "_unread", "_uses")

    def __init__(
        self,
        leases: Sequence[LeaseRecord],
        uses: Mapping[int, int | None],
        over: Mapping[int, list[OverUse]],
        unread: frozenset[int],
    ) -> None:
        self._leases, self._uses, self._over, self._unread = leases, uses, over, unread

    def _add(self, record: LeaseRecord) -> LeaseRecord:
        flags = self._over.get(record.id)
        unknown = any(gpu in self._unread for gpu, _ in record.held)
        return dataclasses.replace(
            record, watched=True,
            used_mib=None if unknown else self._uses.get(record.id, 0),
            over_lease=bool(flags),
            allowed_mib=sum(f.allowed_mib for f in flags) if flags else None,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self._leases)

    @overload
    def __getitem__(self, index: int) -> LeaseRecord: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[LeaseRecord, ...]: ...
    def __getitem__(self, index: int | slice) -> LeaseRecord | tuple[LeaseRecord, ...]:
        if isinstance(index, slice):
            return tuple(map(self._add, self._leases[index]))
        return self._add(self._leases[index])

    def __iter__(self) -> Iterator[LeaseRecord]:
        return map(self._add, self._leases)
