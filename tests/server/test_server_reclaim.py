"""After a restart, a lease is reclaimed only by the client that held it, and only as it held it.

Real servers: SIGKILL, restart, then reclaims by the right client, by another pool of the same
process, by another Unix user (real users, created here when running as root), and reclaims
that do not match the journal.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from hostserver import BOUND, ClientProc, Server, status_of
from hwpool._backends._unix import UnixBackend
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from rawpeers import Pair, become, hello, lines, read_until, reply_to, talk, talk_as

StartServer = Callable[..., Server]
Clients = Callable[..., ClientProc]
FULL = UNITS_PER_GPU


def restart(server: Server, start_server: StartServer, *args: str) -> Server:
    """SIGKILL ``server`` (its journal is brought up to date first) and start it again."""
    status_of(server.socket)  # status is a sync point: the journal is on disk
    server.proc.kill()
    server.proc.wait(BOUND)
    return start_server(*args, socket=server.socket)


def reclaim(req: int, ident: int, held: list[list[int]] | None) -> dict[str, object]:
    return {"op": "reclaim", "req": req, "id": ident, "count": 1, "units": FULL,
            "held": held, "age_s": 1.0}  # fmt: skip


# ----------------------------------------------------------------- item: two pools, one process
def test_one_process_with_two_pools_keeps_both_leases_over_a_restart(
    start_server: StartServer, clients: Clients
) -> None:
    args = ("--gpus", "2", "--grace", "30")
    server = start_server(*args)
    pool_a, pool_b = UnixBackend(server.socket), UnixBackend(server.socket)
    grant_a = pool_a.acquire_blocking(Demand(1, FULL), BOUND)
    grant_b = pool_b.acquire_blocking(Demand(1, FULL), BOUND)
    id_a, id_b = pool_a.lease_id(grant_a.ticket), pool_b.lease_id(grant_b.ticket)
    with pool_b._send_lock:  # pool b reconnects, but cannot re-declare until this ends
        again = restart(server, start_server, *args)
        again.wait_for(f"reclaim #{id_a} by root (uid 0) pid {os.getpid()}")  # then a's "reclaimed"
        newcomer = clients(server.socket)
        newcomer.send("full n 1")  # b's GPU is not free: a's "reclaimed" is not b's
        again.wait_for(f"pid {newcomer.pid}: 1 whole GPU (held back while recovering)")
        assert status_of(server.socket)["server"]["recovering_s"] > 0
    again.wait_for(f"reclaim #{id_b} by root (uid 0) pid {os.getpid()}")
    again.wait_for("recovery over")
    report = status_of(server.socket)
    assert [(x["id"], x["held"]) for x in report["leases"]] == [
        (id_a, [[grant_a.gpus[0], 1.0]]),
        (id_b, [[grant_b.gpus[0], 1.0]]),
    ]
    assert [w["pid"] for w in report["waiting"]] == [newcomer.pid]
    pool_b.release(grant_b)
    assert newcomer.expect("granted n") == f"granted n {list(grant_b.gpus)}"
    pool_a.close()
    pool_b.close()


# ----------------------------------------------------------------- item: one GPU named twice
def test_a_reclaim_naming_one_gpu_twice_is_refused_and_changes_nothing(
    start_server: StartServer,
) -> None:
    args = ("--gpus", "1", "--grace", "30")
    server = start_server(*args)
    token = secrets.token_hex(16)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder:
        holder.settimeout(BOUND)
        holder.connect(str(server.socket))
        acquire = {"op": "acquire", "req": 1, "count": 1, "units": FULL, "wait": True}
        holder.sendall(lines([hello(token), acquire]))
        read_until(holder, 1, [])
        ident = status_of(server.socket)["leases"][0]["id"]
        again = restart(server, start_server, *args)
    again.wait_for("recovering: 1 journaled")
    twice = reclaim(1, ident, [[0, FULL - 1], [0, 1]])
    got = talk(server.socket, [hello(token), twice, {"op": "status", "req": 2}])
    error, status = reply_to(got, 1), reply_to(got, 2)
    assert error["op"] == "error" and error["code"] == "bad_message"
    assert "more than once" in error["message"]
    assert status["free"] == [FULL] and status["leases"] == []  # nothing taken
    right = reclaim(1, ident, [[0, FULL]])
    got = talk(server.socket, [hello(token), right, {"op": "reclaimed", "req": 2},
                               {"op": "status", "req": 3}])  # fmt: skip
    assert reply_to(got, 1) == {"op": "granted", "req": 1, "id": ident, "gpus": [0], "units": FULL}
    assert reply_to(got, 3)["free"] == [0]


# ----------------------------------------------------------------- item: another user's lease
class Holder:
    """A forked child that becomes ``uid`` and holds one whole GPU through a pool until told
    to release it (the interpreter under /root cannot be run by another user: hence fork)."""

    def __init__(self, uid: int, gid: int, path: Path) -> None:
        self.commands_r, self.commands_w = os.pipe()
        self.reports_r, self.reports_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - reports through its pipe
            code = 1
            try:
                os.close(self.commands_w)
                os.close(self.reports_r)
                become(uid, gid)
                pool = UnixBackend(path, reconnect_timeout=BOUND * 3)
                grant = pool.acquire_blocking(Demand(1, FULL), BOUND)
                os.write(self.reports_w, f"granted {pool.lease_id(grant.ticket)}\n".encode())
                os.read(self.commands_r, 1)  # until told
                pool.release(grant)
                pool.close()
                os.write(self.reports_w, b"released\n")
                code = 0
            except BaseException as exc:
                os.write(self.reports_w, f"error {type(exc).__name__}: {exc}\n".encode())
            finally:
                os._exit(code)
        os.close(self.commands_r)
        os.close(self.reports_w)
        self.reports = os.fdopen(self.reports_r)

    def report(self) -> str:
        """Its next line (the test's timeout bounds the wait)."""
        return self.reports.readline().strip()

    def release(self) -> str:
        os.write(self.commands_w, b"x")
        return self.report()

    def end(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.commands_w)
        self.reports.close()


def test_another_user_cannot_reclaim_a_lease_and_its_owner_then_can(
    start_server: StartServer, sockdir: Path, pair: Pair
) -> None:
    path = sockdir / "shared" / "s.sock"
    args = ("--gpus", "1", "--grace", "30", "--group", str(pair.gid))
    server = start_server(*args, socket=path)
    os.chmod(sockdir, 0o711)  # the others may pass through to the shared directory
    alice = Holder(pair.alice, pair.gid, path)
    try:
        granted = alice.report()
        assert granted.startswith("granted "), granted
        ident = int(granted.split()[1])
        assert [(x["id"], x["uid"]) for x in status_of(path)["leases"]] == [(ident, pair.alice)]
        os.kill(alice.pid, signal.SIGSTOP)  # alive, but it cannot reclaim yet
        again = restart(server, start_server, *args)
        again.wait_for("recovering: 1 journaled")

        steal = [hello(secrets.token_hex(16)), reclaim(1, ident, [[0, FULL]]),
                 {"op": "reclaimed", "req": 2}, {"op": "status", "req": 3}]  # fmt: skip
        got = talk_as(pair.bob, pair.gid, path, steal)
        refused, status = reply_to(got, 1), reply_to(got, 3)
        assert refused["op"] == "error" and refused["code"] == "forbidden", refused
        assert f"#{ident}" in refused["message"] and f"uid {pair.alice}" in refused["message"]
        assert status["leases"] == [] and status["free"] == [FULL]  # nothing changed
        assert status["recovering_s"] > 0

        os.kill(alice.pid, signal.SIGCONT)
        name = pwd.getpwuid(pair.alice).pw_name
        again.wait_for(f"reclaim #{ident} by {name} (uid {pair.alice}) pid {alice.pid}")
        again.wait_for("recovery over")
        assert [(x["id"], x["uid"]) for x in status_of(path)["leases"]] == [(ident, pair.alice)]
        late = talk_as(pair.bob, pair.gid, path, [hello(), reclaim(1, ident, [[0, FULL]])])
        assert reply_to(late, 1)["code"] == "lost"  # only the client the journal names
        assert alice.release() == "released"
        assert [g["free"] for g in status_of(path)["gpus"]] == [1.0]
    finally:
        alice.end()


# ----------------------------------------------------------------- item: limits on a reclaim
def limited(sockdir: Path, uid: int, gpus: int) -> Path:
    """A config file limiting ``uid`` (a real user, by name) to ``gpus`` GPUs held at once."""
    config = sockdir / "serve.toml"
    config.write_text(f"[limits.users.{pwd.getpwuid(uid).pw_name}]\ngpus = {gpus}\n")
    return config


def test_a_limited_user_cannot_reclaim_leases_the_journal_never_named(
    start_server: StartServer, sockdir: Path, pair: Pair
) -> None:
    """The issue's bypass: after a restart, a reclaim of made-up leases (any id) was granted
    without its owner's limits, so a user limited to 1 GPU took all 4."""
    path = sockdir / "shared" / "s.sock"
    config = limited(sockdir, pair.bob, 1)
    args = ("--gpus", "4", "--grace", "30", "--group", str(pair.gid), "--config", str(config))
    server = start_server(*args, socket=path)
    os.chmod(sockdir, 0o711)  # the others may pass through to the shared directory
    restart(server, start_server, *args)  # nothing journaled: it serves at once
    everything = [[gpu, FULL] for gpu in range(4)]
    grab = {"op": "reclaim", "req": 1, "id": 7, "count": 4, "units": FULL,
            "held": everything, "age_s": 1.0}  # fmt: skip
    got = talk_as(pair.bob, pair.gid, path, [hello(), grab, reclaim(2, 1, [[0, FULL]])])
    for req in (1, 2):
        refused = reply_to(got, req)
        assert refused["op"] == "error" and refused["code"] == "lost", refused
    report = status_of(path)
    assert report["leases"] == [] and [g["free"] for g in report["gpus"]] == [1.0] * 4


def test_a_journaled_lease_past_its_owners_limit_is_not_taken_back(
    start_server: StartServer, sockdir: Path, pair: Pair
) -> None:
    """A reclaim goes through the admission of a new lease: restarted with a limit of 1 GPU,
    alice gets one of her two journaled leases back, and the other is refused (lost to her
    client), naming the limit."""
    path = sockdir / "shared" / "s.sock"
    args = ("--gpus", "2", "--grace", "30", "--group", str(pair.gid))
    server = start_server(*args, socket=path)
    os.chmod(sockdir, 0o711)
    holders = [Holder(pair.alice, pair.gid, path) for _ in range(2)]
    try:
        for holder in holders:
            assert holder.report().startswith("granted "), holder
        config = limited(sockdir, pair.alice, 1)
        again = restart(server, start_server, *args, "--config", str(config))
        again.wait_for("recovery over")
        line = again.wait_for("refuse a request of")
        assert "limited to 1 GPU held at once" in line, line
        report = status_of(path)
        assert [x["uid"] for x in report["leases"]] == [pair.alice]
        assert sorted(g["free"] for g in report["gpus"]) == [0.0, 1.0]
    finally:
        for holder in holders:
            holder.end()
