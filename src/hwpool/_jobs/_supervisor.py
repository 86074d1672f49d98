"""The per-user supervisor: it holds the user's queued jobs in the host server's queue and
starts each one's launcher when its share is granted.

One supervisor runs per user and state directory (``supervisor.lock``, an ``flock`` held for
its life). It is a client of the host server like any other, on one connection:

- every queued job (dependencies succeeded: ``JobStore.ready()``) waits in the server's queue
  as one request, with the job's priority, its time limit plus the grace and a margin
  (the enforced limit the server may count on) and its id and name as the request's label;
- when a request is granted, the lease is offered for hand-over (``give``) and the job's
  *launcher* is started (``hwpool._cli._launch``), in a session of its own, with the lease's
  id and ticket on its stdin. The launcher takes the lease over (so that the lease is its
  own, and outlives this process), records the job running, runs it and records its end.
  The table is the arbiter: a job is started only by the one launcher whose
  ``queued -> running`` transition commits, so a job is never started twice;
- it watches the launchers (its children, and at start those of running jobs it finds,
  which it adopts): a job still recorded running when its launcher is gone died while
  nothing recorded its end, and is marked ``lost``;
- no lease is left behind by a launcher that died before it took its lease over, or that
  could not be started (``Popen`` failed: EAGAIN at the user's process limit, say): this
  process takes the offered lease back (``take`` with the ticket it kept) and releases it at
  once, and the job is queued again, its record saying why; after
  :data:`MAX_LAUNCH_FAILURES` such launchers in a row it is cancelled, with the last why.
  (If this process dies too, its connection's close frees the offer; and the server
  withdraws an offer nobody took within its ``handover_s``.)

A job table it cannot write (the disk is full: any ``sqlite3.Error``) never ends it: it pauses
(no share asked for, no launcher started), says why once, looks again later and later, and
resumes by itself once the table takes writes again (``_faults``); a launcher that could not
write the table says so by its exit status, :data:`~._faults.TABLE_FAULT`.

It learns of new jobs and cancellations through the table (``PRAGMA data_version``, looked
at twice a second) and, at once, through ``supervisor.sock``, where ``hwpool submit`` and
``hwpool cancel`` wake it. With nothing left to run or watch it exits after ``idle_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import socket
import sqlite3
import struct
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._backends._unix import UnixBackend
from .._core._scheduler import Demand, Grant
from .._errors import RevokedError
from .._gpu._pool import GPUPool, _limited, _owned
from .._wire._bounds import MAX_TEXT
from ._backoff import Backoff
from ._faults import TABLE_FAULT, TableFaults
from ._model import JobRecord, JobState, signal_name
from ._notify import NOTIFY_TIMEOUT_S, Notifiers
from ._procs import is_running, process_start
from ._state import LOCK_NAME, LOG_NAME, SOCKET_NAME
from ._store import JobStateError, JobStore
from ._submit import user_name

__all__ = [
    "GRACE_S",
    "IDLE_S",
    "LIMIT_MARGIN_S",
    "LOCK_NAME",
    "LOG_NAME",
    "SOCKET_NAME",
    "Supervisor",
    "demand_of",
]

GRACE_S = 10.0  # after SIGTERM at a job's time limit or cancel, SIGKILL this much later
LIMIT_MARGIN_S = 5.0  # past the grace, for the job's group to be gone and its lease released
IDLE_S = 60.0  # with nothing to run or watch, the supervisor exits after this long
PRUNE_EVERY_S = 3600.0  # how often the history is pruned while the supervisor runs
POLL_S = 0.5  # how often the table is looked at for changes nobody woke it for
MAX_REQUESTS = 128  # jobs waiting in the server's queue at once (the rest wait in the table)
MAX_LAUNCH_FAILURES = 3  # launchers that ended without starting the job before it is given up


@dataclass
class _Launcher:
    """A job's launcher this supervisor watches: its child (``process``) or one it found
    running at start (adopted: ``process`` is None)."""

    job_id: str
    pid: int
    start: int | None
    process: subprocess.Popen[bytes] | None
    offer: tuple[int, str] | None = None  # the lease offered to it and its ticket (a child)


def demand_of(pool: GPUPool, job: JobRecord, grace_s: float) -> Demand:
    """The server request for ``job``: its share (or memory), its priority, and its time
    limit plus ``grace_s`` and :data:`LIMIT_MARGIN_S`. The launcher counts the time limit
    from the grant, as the server does (one clock), ends the job then (SIGTERM, SIGKILL
    ``grace_s`` later) and releases the lease once the job's processes are gone: before the
    server's limit, which is only the backstop (a launcher that hangs)."""
    if job.memory_mib is not None:
        demand = pool._one_demand(None, job.memory_mib)
    elif isinstance(job.gpus, int):
        demand = pool._whole_demand(job.gpus)
    else:
        demand = pool._one_demand(1.0 if job.gpus is None else float(job.gpus), None)
    demand = _owned(demand, None, job.priority)
    limit = None if job.time_limit is None else job.time_limit + grace_s + LIMIT_MARGIN_S
    return _limited(demand, limit)


class Supervisor:
    """Runs one user's jobs (see the module). ``connect(memory)`` opens the client of the
    host server (called when the first job needs a share); ``launcher`` is the argv that starts
    a launcher, to which the state directory is appended."""

    def __init__(
        self,
        store: JobStore,
        directory: Path,
        connect: Callable[[bool], UnixBackend],
        launcher: Sequence[str],
        *,
        idle_s: float = IDLE_S,
        grace_s: float = GRACE_S,
        log: Callable[[str], None] = print,
        prune: Callable[[], None] | None = None,
        notify_timeout: float = NOTIFY_TIMEOUT_S,
    ) -> None:
        self._store, self._directory = store, directory
        self._prune, self._pruned_at = prune, time.monotonic()
        self._connect, self._launcher_argv = connect, list(launcher)
        self._idle_s, self._grace_s, self._log = idle_s, grace_s, log
        self._backend: UnixBackend | None = None
        self._pool: GPUPool | None = None
        self._requests: dict[str, asyncio.Task[None]] = {}  # queued job -> its request
        self._asked: dict[str, tuple[object, ...]] = {}  # queued job -> what it asked for
        self._launchers: dict[int, _Launcher] = {}  # pid -> launcher
        self._failures: dict[str, int] = {}  # job -> launchers that did not start it
        self._wake = asyncio.Event()
        self._version: int | None = None  # the table's data_version when last settled
        self._busy = True
        self._retry_at = 0.0  # when to try the server again after it could not be reached
        self._refusals = Backoff()  # refused requests: when to ask again, what was logged
        self._faults = TableFaults()  # the pause while the table cannot be written
        self._notifiers = Notifiers(log, notify_timeout)  # notify commands of jobs that ended

    # ------------------------------------------------------------------ the loop
    async def run(self) -> None:
        """Supervise until idle for ``idle_s``."""
        server = await self._listen()
        idle_since: float | None = None
        try:
            while True:
                woken = self._wake.is_set()
                self._wake.clear()
                busy = self._look(woken)
                now = time.monotonic()
                if busy:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= self._idle_s:
                    # No more wakes from here; a job added before the socket closed is in
                    # the table (it is added before the wake), so one last look finds it.
                    server.close()
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._directory / SOCKET_NAME)
                    if not self._settle(True):
                        self._log("nothing left to run or watch: exiting")
                        return
                    server, idle_since = await self._listen(), None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(POLL_S, self._faults.wait_s(now))):
                        await self._wake.wait()
        finally:
            server.close()
            self._notifiers.stop()
            for task in self._requests.values():
                task.cancel()
            await asyncio.gather(*self._requests.values(), return_exceptions=True)
            if self._backend is not None:
                self._backend.close()

    def _look(self, woken: bool) -> bool:
        """:meth:`_settle` (and prune, now and then), unless paused by a table fault; a fault
        starts or prolongs the pause, and the first look that goes through ends it. Whether
        anything is left to run or watch (a pause counts as something)."""
        now = time.monotonic()
        if self._faults.wait_s(now) > 0:
            return True
        try:
            busy = self._settle(woken or self._faults.paused)
            if self._prune is not None and now - self._pruned_at >= PRUNE_EVERY_S:
                self._prune()  # the history past its retention, with its logs
                self._pruned_at = now
        except sqlite3.Error as exc:
            self._table_fault(f"the job table cannot be written: {exc}")
            return True
        if self._faults.healed():
            self._log("the job table answered again: resuming")
        return busy

    def _table_fault(self, reason: str) -> None:
        """Pause (see ``_faults``), saying why when the reason is new."""
        self._version = None  # look again whatever the table's version then
        if self._faults.failed(reason, time.monotonic()):
            self._log(f"{reason}: pausing (no share asked for, no launcher started), looking "
                      "again later and later, up to each minute")  # fmt: skip

    def _settle(self, woken: bool) -> bool:
        """Bring the requests and launchers in line with the table (when it changed, or
        something woke the loop); whether anything is left to run or watch."""
        reaped = self._reap()
        self._notifiers.reap()
        version = self._store.data_version()
        if not (woken or reaped or version != self._version or self._retry_at):
            return self._busy or self._notifiers.busy
        self._version = version  # a change committed from now on is seen next time
        self._busy = self._align()
        self._notify()
        return self._busy or self._notifiers.busy

    def _notify(self) -> None:
        """Start the notify command of each job that ended since (at most once: the table
        records it started before it is)."""
        for job in self._store.to_notify():
            if self._store.mark_notified(job.id):
                self._notifiers.start(job, user_name())

    def _align(self) -> bool:
        queued = self._store.ready()  # in submit order: the server's order among our own
        running = self._store.list(states=[JobState.RUNNING])
        watched = {launcher.job_id for launcher in self._launchers.values()}
        for job in running:
            if job.id not in watched:
                self._adopt(job)
        wanted = {job.id: _asked(job) for job in queued}
        self._refusals.keep(wanted)
        for job_id in list(self._requests):
            if wanted.get(job_id) != self._asked.get(job_id) and not self._requests[job_id].done():
                self._requests[job_id].cancel()  # cancelled, held or edited: withdraw it
        launching = {launcher.job_id for launcher in self._launchers.values()}
        # The first MAX_REQUESTS in the order the server would serve them (priority, then
        # submit order) wait in its queue; the server refuses more from one connection.
        room = MAX_REQUESTS - len(self._requests)
        new = [job for job in queued if job.id not in self._requests and job.id not in launching]
        new = sorted(new, key=lambda job: (-job.priority, job.number))
        new = _within_array_limits(new, [*running, *queued], {*self._requests, *launching})
        new = new[: max(room, 0)]
        if new and not self._reachable(any(job.memory_mib is not None for job in new)):
            new = []
        self._withdraw_behind(new, queued)
        for job in new:
            self._asked[job.id] = _asked(job)
            self._requests[job.id] = asyncio.create_task(self._serve(job))
        waiting = self._store.list(states=[JobState.WAITING])
        return bool(queued or running or waiting or self._launchers or self._requests)

    def _withdraw_behind(self, new: Sequence[JobRecord], queued: Sequence[JobRecord]) -> None:
        """Withdraw the waiting requests that ``new`` ones must precede: the server serves one
        user's requests of one priority in the order they arrive, so a job asked for late (a
        hold released, a dependency met) keeps its place only if those submitted after it
        are asked for again behind it (they are, at the next look: their tasks wake it)."""
        first: dict[int, int] = {}
        for job in new:
            first.setdefault(job.priority, job.number)
        for job in queued:
            task = self._requests.get(job.id)
            if (
                task is not None
                and not task.done()
                and job.number > first.get(job.priority, job.number)
            ):
                task.cancel()

    # ------------------------------------------------------------------ requests
    async def _serve(self, job: JobRecord) -> None:
        """Wait for ``job``'s share, then start its launcher with the lease."""
        backend, pool = self._backend, self._pool
        assert backend is not None and pool is not None
        try:
            demand = demand_of(pool, job, self._grace_s)
            label = f"{job.id} {job.name}"[:MAX_TEXT]
            command = shlex.join(job.argv)[:MAX_TEXT]
            grant = await backend.acquire(demand, None, name=label, command=command)
        except asyncio.CancelledError:
            raise
        except (ValueError, TypeError) as exc:  # a request this server can never grant
            self._refusals.forget(job.id)
            self._give_up(job.id, f"the server refused its request: {exc}")
            return
        except RevokedError as exc:  # `hwpool cancel N` of its request: the job's cancel
            self._refusals.forget(job.id)
            self._give_up(job.id, f"its {exc}")
            return
        except Exception as exc:  # a refusal that may pass: try again later and later
            refusal = self._refusals.refused(job.id, str(exc))
            if refusal.new:
                self._log(f"{job.id}: no share yet (asking again, backing off to 5 min): {exc}")
            await asyncio.sleep(refusal.delay_s)
            return
        finally:
            self._requests.pop(job.id, None)
            self._asked.pop(job.id, None)
            self._wake.set()
        self._refusals.forget(job.id)
        self._start(job, backend, grant)

    def _reachable(self, memory: bool) -> bool:
        """Whether a client of the host server is open (opening it now if none is, but
        not more often than every few seconds while it cannot be reached; ``memory``: a
        server it starts is sized in memory, for the jobs that ask for memory)."""
        if self._backend is not None:
            return True
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._backend = self._connect(memory)
        except (ConnectionError, OSError) as exc:
            self._log(f"cannot reach the hwpool server (trying again in 5 s): {exc}")
            self._retry_at = time.monotonic() + 5.0
            return False
        self._retry_at = 0.0
        self._pool = GPUPool(backend=self._backend)
        return True

    def _start(self, job: JobRecord, backend: UnixBackend, grant: Grant) -> None:
        """Offer ``grant`` for hand-over and start ``job``'s launcher with it."""
        lease_id = backend.lease_id(grant.ticket)
        try:
            ticket = backend.give(grant)
        except Exception as exc:
            self._log(f"{job.id}: could not hand its lease over: {exc}")
            with contextlib.suppress(Exception):
                backend.release(grant)
            return
        assert lease_id is not None
        handoff = {"job": job.id, "lease": lease_id, "ticket": ticket,
                   "socket": str(backend.socket)}  # fmt: skip
        try:
            process = subprocess.Popen(
                [*self._launcher_argv, str(self._directory)],
                stdin=subprocess.PIPE, start_new_session=True, cwd="/",
            )  # fmt: skip
        except OSError as exc:  # EAGAIN at the process limit, ENOMEM, a launcher gone
            self._take_back(job.id, (lease_id, ticket))
            self._launch_failed(job.id, f"its launcher could not be started ({exc})")
            return
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(json.dumps(handoff).encode() + b"\n")
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        self._launchers[process.pid] = _Launcher(
            job.id, process.pid, process_start(process.pid), process, (lease_id, ticket)
        )
        self._watch(process.pid)
        self._log(f"{job.id}: granted lease #{lease_id}; launcher {process.pid} started")

    def _take_back(self, job_id: str, offer: tuple[int, str]) -> None:
        """Take back the lease offered to a launcher that is gone, and release it: its GPUs
        go on at once. Nothing to do when the launcher took it (the lease was then its
        connection's, freed when it died) or the offer is gone (the server restarted)."""
        backend = self._backend
        if backend is None:
            return
        lease_id, ticket = offer
        try:
            grant = backend.take(lease_id, ticket)
        except (ValueError, TypeError, ConnectionError):
            return  # taken by the launcher (and freed with it), withdrawn, or no server
        with contextlib.suppress(Exception):  # a lease the server revoked meanwhile, say
            backend.release(grant)
        self._log(f"{job_id}: took lease #{lease_id} back from its launcher, which never took "
                  "it, and released it")  # fmt: skip

    def _launch_failed(self, job_id: str, why: str) -> None:
        """A launcher of ``job_id`` ended (or never started) before it started the job: the
        job is asked for again, its record saying why, or, after MAX_LAUNCH_FAILURES in a
        row, cancelled with why."""
        failures = self._failures.get(job_id, 0) + 1
        self._failures[job_id] = failures
        if failures >= MAX_LAUNCH_FAILURES:
            self._give_up(job_id, f"{why}; {failures} launchers in a row failed: see "
                          f"{str(self._directory / LOG_NAME)!r}")  # fmt: skip
            return
        note = f"{why}: queued again ({failures} of {MAX_LAUNCH_FAILURES} tries)"
        try:
            with contextlib.suppress(JobStateError):  # cancelled meanwhile
                self._store.note_queued(job_id, note)
        except sqlite3.Error as exc:  # the job stays queued, without the note
            self._table_fault(f"the job table cannot be written: {exc}")
        self._log(f"{job_id}: {note}")

    def _give_up(self, job_id: str, reason: str) -> None:
        """Cancel ``job_id`` with ``reason``; a table fault leaves it queued, asked for
        again after the pause."""
        try:
            with contextlib.suppress(JobStateError):
                self._store.mark_cancelled(job_id, reason=reason)
        except sqlite3.Error as exc:
            self._table_fault(f"the job table cannot be written: {exc}")
            return
        self._log(f"{job_id}: {reason}")

    # ------------------------------------------------------------------ launchers
    def _adopt(self, job: JobRecord) -> None:
        """Watch the launcher of ``job``, running when this supervisor found it; or mark
        the job lost when its launcher is gone."""
        assert job.pid is not None
        if is_running(job.pid, job.pid_start):
            self._launchers[job.pid] = _Launcher(job.id, job.pid, job.pid_start, None)
            self._watch(job.pid)
            self._log(f"{job.id}: adopted its running launcher {job.pid}")
            return
        self._lose(job.id, job.pid, "its launcher was gone: the job ended while nothing "
                   "recorded its end")  # fmt: skip

    def _lose(self, job_id: str, pid: int, reason: str) -> None:
        with contextlib.suppress(JobStateError):
            job = self._store.get(job_id)
            if job.state is JobState.RUNNING and job.pid == pid:
                self._store.mark_lost(job_id, reason=reason)
                self._log(f"{job_id}: lost: {reason}")

    def _watch(self, pid: int) -> None:
        """Wake the loop as soon as ``pid`` ends (where ``pidfd_open`` exists; the loop
        looks at every launcher twice a second anyway)."""
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return
        loop = asyncio.get_running_loop()

        def ended() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            self._wake.set()

        loop.add_reader(fd, ended)

    def _reap(self) -> bool:
        """Forget the launchers that ended (whether any did); a job they leave recorded
        running is lost, one they leave queued (they could not take the lease) is asked for
        again."""
        reaped = False
        for pid, launcher in list(self._launchers.items()):
            if launcher.process is not None:
                code = launcher.process.poll()
                if code is None:
                    continue
            elif is_running(pid, launcher.start):
                continue
            else:
                code = None
            del self._launchers[pid]
            self._ended(launcher, code)
            reaped = True
        return reaped

    def _ended(self, launcher: _Launcher, code: int | None) -> None:
        try:
            job = self._store.get(launcher.job_id)
        except LookupError:
            return
        started = job.pid == launcher.pid and job.started_at is not None
        if launcher.offer is not None and not started:
            self._take_back(job.id, launcher.offer)  # it died before it took the lease over
        how = _how_ended(code)
        if code == TABLE_FAULT and job.state is JobState.QUEUED:  # it could not start it
            self._table_fault(f"{job.id}'s launcher could not record it running (the job "
                              "table could not be written): it is queued again")  # fmt: skip
        elif code == TABLE_FAULT and job.state is JobState.RUNNING and job.pid == launcher.pid:
            self._lose(job.id, launcher.pid, "its launcher could not record its end (the job "
                       "table could not be written): how it ended is unknown")  # fmt: skip
        elif job.state is JobState.RUNNING and job.pid == launcher.pid:
            self._lose(job.id, launcher.pid, f"its launcher {how} without recording its end")
        elif job.state is JobState.QUEUED:
            self._log(f"{job.id}: launcher {launcher.pid} {how} before it started the job")
            self._launch_failed(job.id, f"its launcher {how} before it started the job")

    # ------------------------------------------------------------------ waking
    async def _listen(self) -> asyncio.AbstractServer:
        """``supervisor.sock``: a connection from this user wakes the loop."""
        path = self._directory / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a dead supervisor's: the lock says none other runs
        return await asyncio.start_unix_server(self._woken, path=str(path))

    async def _woken(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        with contextlib.suppress(OSError):
            if _peer_uid(sock) == os.geteuid():
                self._wake.set()
        writer.close()


def _within_array_limits(
    new: Sequence[JobRecord], known: Sequence[JobRecord], asked: set[str]
) -> list[JobRecord]:
    """``new`` less the array members that would make more of their array run or wait at
    the server than its ``%K`` (``known``: every running and queued job; ``asked``: the ids
    with a request or a launcher now)."""
    active: dict[str, set[str]] = {}
    for job in known:
        if job.array_id is not None and (job.state is JobState.RUNNING or job.id in asked):
            active.setdefault(job.array_id, set()).add(job.id)
    kept = []
    for job in new:
        if job.array_id is not None and job.array_limit is not None:
            members = active.setdefault(job.array_id, set())
            if len(members) >= job.array_limit:
                continue
            members.add(job.id)
        kept.append(job)
    return kept


def _asked(job: JobRecord) -> tuple[object, ...]:
    """What a job's server request is made of: an edit of any of it (``hwpool update``) asks
    again."""
    return (job.gpus, job.memory_mib, job.priority, job.time_limit, job.name)


def _how_ended(code: int | None) -> str:
    """``was killed by SIGKILL``, ``exited 3``, ``ended``: how a launcher ended (its
    ``Popen.returncode``; None for an adopted one, whose status is not known)."""
    if code is None:
        return "ended"
    if code < 0:
        return f"was killed by {signal_name(-code)}"
    return f"exited {code}"


def _peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of Unix socket ``sock`` (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])
