"""Draining (``hwpool drain`` / ``hwpool resume``): GPUs taken out of service by an admin.

No change to the core: a drained GPU is withheld whole (:meth:`Scheduler.withhold`), so
nothing new is granted there, while the leases that hold it run to their end (its free units
go below zero until they are released). The GPU watch withholds memory used outside the
queue through the same call; both are kept here, per GPU, and the core is told the larger
(``total if drained else outside``), so neither overwrites the other. Draining the whole
server drains every GPU. Waiters stay queued; while the whole server is drained each says
``draining`` with the admin's reason (the status's business, :mod:`._host_status`).

What is drained (:class:`Drained`) is the server's to keep on disk (``_drain_file``): the
state checks a request (:meth:`planned_drain`), the server writes the file, then the state
applies it (:meth:`apply_drain`), so a drain the file does not have is never in force.
"""

from __future__ import annotations

from .._wire._protocol import Done, Drain, ErrorCode, ProtocolError
from ._drain_file import Drained
from ._host_entries import Client, Delivery
from ._host_recovery import _HostRecovery


class _HostDrain(_HostRecovery):
    """Drained GPUs and the memory the GPU watch withholds (see the module)."""

    def withhold(self, gpu: int, units: int, now: float) -> list[Delivery]:
        """Withhold ``units`` of ``gpu`` from what is shared (memory used outside the queue;
        they replace what was withheld there before), granting what a smaller amount lets
        through; a drained GPU stays withheld whole. Not journaled: a restarted server
        samples the GPUs again."""
        self._outside[gpu] = units
        return self._withhold_now(gpu, now)

    def _withhold_now(self, gpu: int, now: float) -> list[Delivery]:
        """Tell the core what ``gpu`` withholds now: all of it if drained, else what the
        watch withholds; the waiters a smaller amount lets through are granted."""
        drained = self.drained.reason_of(gpu) is not None
        units = self.core.totals[gpu] if drained else self._outside[gpu]
        return self._deliver(self.core.withhold(gpu, units, now=now), now)

    # ----------------------------------------------------------------- drain and resume
    def planned_drain(self, actor: Client, msg: Drain) -> Drained:
        """What is drained once ``msg`` is applied, changing nothing. ProtocolError for an
        actor who is not an admin (``forbidden``), a GPU this server does not have
        (``not_found``, naming it), or resuming one GPU while the whole server is drained
        (``bad_message``)."""
        if actor.uid not in self.admins:
            what = "resume" if msg.resume else "drain"
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"only an admin of this server (root or its admin group) may {what} it; "
                f"{actor.user or f'uid {actor.uid}'} is not one",
                msg.req,
            )
        num_gpus = self.core.num_gpus
        for gpu in msg.gpus:
            if gpu >= num_gpus:
                raise ProtocolError(
                    ErrorCode.NOT_FOUND,
                    f"no GPU {gpu}: this server has GPUs 0 to {num_gpus - 1}",
                    msg.req,
                )
        now = self.drained
        gpus = dict(now.gpus)
        if not msg.gpus:
            if msg.resume:
                return Drained()
            return Drained(msg.reason, now.gpus)
        if msg.resume and now.server is not None:
            raise ProtocolError(
                ErrorCode.BAD_MESSAGE,
                "the whole server is drained: resume it whole (no GPU named), which resumes "
                "every GPU",
                msg.req,
            )
        for gpu in msg.gpus:
            if msg.resume:
                gpus.pop(gpu, None)
            else:
                gpus[gpu] = msg.reason
        return Drained(now.server, tuple(sorted(gpus.items())))

    def apply_drain(
        self, actor: Client, msg: Drain, drained: Drained, now: float
    ) -> list[Delivery]:
        """Put ``drained`` (:meth:`planned_drain`'s for ``msg``) in force, and log who did
        it: the actor is answered ``done``; a resume grants what it lets through."""
        by = actor.user or f"uid {actor.uid}"
        where = (
            "the server" if not msg.gpus
            else f"GPU{'s' if len(msg.gpus) > 1 else ''} {', '.join(map(str, msg.gpus))}"
        )  # fmt: skip
        if msg.resume:
            self.log(f"resume {where} by {by}")
        else:
            self.log(f"drain {where} by {by}" + (f": {msg.reason}" if msg.reason else ""))
        return [(actor, Done(msg.req)), *self.restore_drained(drained, now)]

    def drain(self, actor: Client, msg: Drain, now: float) -> list[Delivery]:
        """``hwpool drain`` / ``resume``, with nothing kept on disk (the server keeps it
        between :meth:`planned_drain` and :meth:`apply_drain`)."""
        return self.apply_drain(actor, msg, self.planned_drain(actor, msg), now)

    def restore_drained(self, drained: Drained, now: float) -> list[Delivery]:
        """Make ``drained`` what is drained (at start: what the drain file says); the waiters
        a resumed GPU lets through are granted."""
        before, self.drained = self.drained, drained
        self.changes += 1  # the waiters' reasons change
        out: list[Delivery] = []
        for gpu in range(self.core.num_gpus):
            if (before.reason_of(gpu) is None) != (drained.reason_of(gpu) is None):
                out += self._withhold_now(gpu, now)
        return out

    # ----------------------------------------------------------------- after a restart
    def _restore(
        self,
        client: Client,
        held: tuple[tuple[int, int], ...],
        req: int,
        since: float | None,
        now: float,
    ) -> int | None:
        """A lease held before a restart is taken back on a drained GPU too (it was granted
        before the drain, and runs to its end): the drain's withholding is lifted while it
        is restored (nothing waits in the core then), and put back after."""
        drained = [gpu for gpu, _ in held if self.drained.reason_of(gpu) is not None]
        if self.core.queue_length:  # the core refuses to restore then: lift nothing
            drained = []
        for gpu in drained:
            self.core.withhold(gpu, self._outside[gpu], now=now)
        try:
            return super()._restore(client, held, req, since, now)
        finally:
            for gpu in drained:
                self.core.withhold(gpu, self.core.totals[gpu], now=now)
