"""Leases the host server takes back: a time limit that ran out, ``hwpool cancel``, overuse
of GPU memory; a revoked lease's GPUs held while a job of its holder is proven to run;
hand-over offers nobody took; and the GPU watch's view of the leases."""

from __future__ import annotations

import heapq

from .._wire._protocol import Revoked
from ._defaults import REVOKED_RECHECK_S
from ._host_admission import _HostAdmission
from ._host_entries import Delivery, Entry, _job


class _HostRevokes(_HostAdmission):
    """Time limits, revoked leases' holds, lapsed offers, overuse (see the module)."""

    def next_limit_end(self) -> float | None:
        """When the earliest time limit of a lease held now runs out (None: no lease has
        one); the I/O layer calls :meth:`expire` then."""
        ends, by_id = self._ends, self._by_id
        while ends:
            end, ident = ends[0]
            entry = by_id.get(ident)
            if entry is not None and entry.held is not None and entry.limit_end == end:
                return end
            heapq.heappop(ends)  # released, or its end moved (a reclaim): stale
        return None

    def expire(self, now: float) -> list[Delivery]:
        """Revoke every lease whose time limit has run out by ``now``: it is released as any
        (the journal says so), its owner is told ``revoked`` (reason ``limit``), and the
        waiters its capacity lets through are granted."""
        out: list[Delivery] = []
        while (end := self.next_limit_end()) is not None and end <= now:
            ident = heapq.heappop(self._ends)[1]
            entry = self._by_id[ident]
            held_s = now - entry.since
            self.log(
                f"revoke {_job(entry)} of {entry.client}: its time limit ran out after "
                f"{held_s:.3f} s: {self._what(entry.held or {})}"
            )
            notice = Revoked(entry.req, entry.id, entry.client.uid, "limit")
            out.append((entry.client, notice))
            out += self._hold_revoked(entry, now)
        return out + self._end_holds(now) + self._end_offers(now)

    def next_deadline(self) -> float | None:
        """When :meth:`expire` has something to do next: a time limit runs out, or a revoked
        lease's hold ends (None: nothing)."""
        if not self._revoked and not self._offered:  # the common case: time limits only
            return self.next_limit_end()
        ends = [e.revoked_until for e in self._revoked.values() if e.revoked_until is not None]
        ends += [e.offered_until for e in self._offered.values() if e.handover is not None]
        limit = self.next_limit_end()
        return min([*ends, *([] if limit is None else [limit])], default=None)

    def _hold_revoked(self, entry: Entry, now: float) -> list[Delivery]:
        """Lease ``entry`` was revoked: it is gone for its client and the journal; its GPUs
        stay held while a job of its holder is proven to run (see the module docstring), and
        go back at once otherwise (answered: the waiters they let through)."""
        self._drop(entry)
        self.released += 1
        if not self.job_runs(entry.client):
            self._revoked[entry.id] = entry
            return self._free_revoked(entry, now, "no job of its holder runs")
        entry.revoked_until = now + self.revoked_hold_s
        self._revoked[entry.id] = entry
        self.log(
            f"hold {self._what(entry.held or {})} of revoked {_job(entry)} until the processes "
            f"of {entry.client} are gone ({self.revoked_hold_s:g} s at most unless its job runs)"
        )
        return []

    def _end_holds(self, now: float) -> list[Delivery]:
        """Free the revoked leases whose hold has run out by ``now``, unless the job of their
        holder still runs (then ask again later)."""
        out: list[Delivery] = []
        for entry in [e for e in self._revoked.values() if (e.revoked_until or 0.0) <= now]:
            if self.job_runs(entry.client):
                entry.revoked_until = now + REVOKED_RECHECK_S
            else:
                out += self._free_revoked(entry, now, "its hold ran out, no job of it runs")
        return out

    def _end_offers(self, now: float) -> list[Delivery]:
        """Withdraw the hand-over offers nobody took by ``now`` and release their leases (the
        giver forgot them when it gave them); forget the offers taken or gone meanwhile."""
        out: list[Delivery] = []
        for entry in list(self._offered.values()):
            if entry.handover is None or entry.held is None:
                del self._offered[entry.id]  # taken, released or revoked meanwhile
            elif entry.offered_until <= now:
                del self._offered[entry.id]
                self.log(
                    f"withdraw the offer of {_job(entry)} of {entry.client}: nobody took it "
                    f"within {self.handover_s:g} s: release {self._what(entry.held)}"
                )
                out += self._remove(entry, now)
        return out

    def _free_revoked(self, entry: Entry, now: float, why: str) -> list[Delivery]:
        """Give back the GPUs of revoked lease ``entry``: the waiters they let through."""
        del self._revoked[entry.id]
        held = entry.held or {}
        self.log(f"free {self._what(held)} of revoked {_job(entry)}: {why}")
        grants = self.core.release_many(held.items(), ticket=entry.granted_as, now=now)
        return self._deliver(grants, now)

    def held_leases(self) -> list[Entry]:
        """The leases held now, by id (for the GPU watch's view of them)."""
        return [e for e in sorted(self._by_id.values(), key=lambda e: e.id) if e.held is not None]

    def revoked_leases(self) -> list[Entry]:
        """The revoked leases whose GPUs are still held (their processes may still run), by
        id: the GPU watch counts their processes as theirs, not outside the queue."""
        return sorted(self._revoked.values(), key=lambda e: e.id)

    def lease(self, ident: int) -> Entry | None:
        """Lease ``ident`` if it is held now."""
        entry = self._by_id.get(ident)
        return entry if entry is not None and entry.held is not None else None

    def end_for_overuse(self, entry: Entry, by: int, now: float) -> list[Delivery]:
        """End lease ``entry`` for using more GPU memory than it was leased: its holder is told
        ``revoked`` (reason ``overuse``, by uid ``by``: the server's), and it is released."""
        self.log(f"revoke {_job(entry)} of {entry.client}: ended for overuse: "
                 f"{self._what(entry.held or {})}")  # fmt: skip
        notice = Revoked(entry.req, entry.id, by, "overuse")
        return [(entry.client, notice), *self._hold_revoked(entry, now)]
