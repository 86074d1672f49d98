"""``hwpool drain`` / ``hwpool resume`` on a real server: a drained server or GPU grants
nothing new while the leases there run to their end, waiters say why they wait, the drain
survives a restart (SIGKILL included), and a refused drain (not an admin, a bad GPU or
reason) changes nothing."""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hostserver import BOUND, Server, run_cli, status_of
from hwpool._cli._jobs_waits import job_waits
from hwpool._cli._waitwhy import wait_words
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._jobs._store import JobStore
from hwpool._wire._bounds import MAX_REASON
from rawpeers import Peer, acquire, hello
from users import Users

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU


def _peer(path: Path, peers: list[Peer]) -> Peer:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(BOUND)
    sock.connect(str(path))
    peer = Peer(sock)
    peers.append(peer)
    peer.send(hello())
    return peer


def _hwpool(*args: str) -> tuple[int, str, str]:
    return run_cli(*args)


def _queued(peer: Peer, req: int, probe: int) -> dict[str, object]:
    """The ``queued`` answer to ``req`` (read up to the answer of a ``status`` sent after
    it as ``probe``: the server answers in order)."""
    peer.send({"op": "status", "req": probe})
    peer.answer(probe)
    (found,) = [r for r in peer.replies if r.get("req") == req and r["op"] == "queued"]
    return found


def _waiter(path: Path, ident: int) -> dict[str, object]:
    (found,) = [w for w in status_of(path)["waiting"] if w["id"] == ident]
    return found


def test_a_drained_server_lets_its_lease_run_and_grants_nothing_until_resumed(
    start_server: StartServer, sockdir: Path, peers: list[Peer]
) -> None:
    path = sockdir / "s.sock"
    server = start_server("--gpus", "1", socket=path)
    holder, waiter = _peer(path, peers), _peer(path, peers)
    holder.send(acquire(1))
    lease = holder.answer(1)
    assert lease["op"] == "granted"
    code, out, err = _hwpool("drain", "--socket", str(path), "--reason", "driver update")
    assert (code, out, err) == (0, "drained the server: driver update\n", "")
    server.wait_for("drain the server by root (uid 0): driver update")
    # The lease runs on; a new request waits, and says why.
    report = status_of(path)
    assert [x["id"] for x in report["leases"]] == [lease["id"]]
    assert report["server"]["draining"] == "driver update"
    assert report["gpus"][0]["draining"] == "driver update"
    waiter.send(acquire(1))
    queued = _queued(waiter, 1, 2)
    why = _waiter(path, queued["id"])
    assert (why["reason"], why["reason_detail"], why["estimated_start"]) == (
        "draining", "driver update", None,
    )  # fmt: skip
    code, text, _ = _hwpool("status", "--socket", str(path))
    assert "draining: driver update: nothing new is granted" in text
    assert "-- draining: driver update; start unknown" in text
    # The lease ends: nothing is granted (the waiter is still queued).
    holder.send({"op": "release", "req": 2, "of": 1}, {"op": "status", "req": 3})
    after = holder.answer(3)
    assert (after["leases"], [w["id"] for w in after["waiting"]]) == ([], [queued["id"]])
    # Resumed: the waiter is granted at once.
    assert _hwpool("resume", "--socket", str(path)) == (0, "resumed the server\n", "")
    assert waiter.answer(1)["op"] == "granted"
    server.wait_for("resume the server by root (uid 0)")
    assert status_of(path)["server"]["draining"] is None


def test_new_work_goes_to_the_gpu_that_is_not_drained(
    start_server: StartServer, sockdir: Path, peers: list[Peer]
) -> None:
    path = sockdir / "s.sock"
    start_server("--gpus", "2", socket=path)
    code, out, _ = _hwpool("drain", "--socket", str(path), "--gpu", "0", "--reason", "fan")
    assert (code, out) == (0, "drained GPU 0: fan\n")
    client = _peer(path, peers)
    client.send(acquire(1), acquire(2))
    assert client.answer(1)["gpus"] == [1]
    _queued(client, 2, 3)  # GPU 0 is free, but drained
    report = status_of(path)
    assert report["server"]["draining"] is None
    assert [g["draining"] for g in report["gpus"]] == ["fan", None]
    assert "  draining: fan" in _hwpool("status", "--socket", str(path))[1].splitlines()[2]
    assert _hwpool("resume", "--socket", str(path), "--gpu", "0") == (0, "resumed GPU 0\n", "")
    assert client.answer(2)["op"] == "granted"


def test_a_drain_survives_a_sigkill_of_the_server(start_server: StartServer, sockdir: Path) -> None:
    path = sockdir / "s.sock"
    first = start_server("--gpus", "2", socket=path)
    assert _hwpool("drain", "--socket", str(path), "--gpu", "1", "--reason", "bad fan")[0] == 0
    assert _hwpool("drain", "--socket", str(path), "--reason", "driver update")[0] == 0
    drain_file = sockdir / "s.sock.drain"
    assert drain_file.stat().st_mode & 0o777 == 0o600
    first.kill()  # SIGKILL: nothing is written on the way out
    second = start_server("--gpus", "2", socket=path)
    second.wait_for("drained (as")
    report = status_of(path)
    assert report["server"]["draining"] == "driver update"
    assert [g["draining"] for g in report["gpus"]] == ["driver update", "bad fan"]
    # Resuming the whole server resumes every GPU; a restart then keeps nothing drained.
    assert _hwpool("resume", "--socket", str(path))[0] == 0
    assert not drain_file.exists()
    second.kill()
    start_server("--gpus", "2", socket=path)
    assert [g["draining"] for g in status_of(path)["gpus"]] == [None, None]


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"version": 1, "server": "x", "gpus": [[5, "r"]]}',
        b'{"version": 1, "server": "a\\u001bb"}',
    ],
)
def test_a_drain_file_that_is_not_valid_stops_the_start_naming_it(
    start_server: StartServer, sockdir: Path, content: bytes
) -> None:
    drain_file = sockdir / "s.sock.drain"
    drain_file.write_bytes(content)
    drain_file.chmod(0o600)
    server = start_server("--gpus", "2", socket=sockdir / "s.sock", wait=False)
    assert server.proc.wait(BOUND) != 0
    server.kill()
    said = "\n".join(server.lines)
    assert f"the drain file {str(drain_file)!r} is not valid" in said
    assert not (sockdir / "s.sock").exists()  # no socket left behind


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("drain", "--gpu", "2"), "no GPU 2: this server has GPUs 0 to 1"),
        (("resume", "--gpu", "7"), "no GPU 7"),
        (("drain", "--gpu", "-1"), "--gpu: a GPU index"),
        (("drain", "--reason", "x" * (MAX_REASON + 1)), f"at most {MAX_REASON} characters"),
        (("drain", "--reason", "line\nbreak"), "must be printable text"),
    ],
)
def test_bad_input_is_refused_naming_it_and_changes_nothing(
    start_server: StartServer, sockdir: Path, args: tuple[str, ...], words: str
) -> None:
    path = sockdir / "s.sock"
    start_server("--gpus", "2", socket=path)
    code, out, err = _hwpool(*args, "--socket", str(path))
    assert (code, out) == (2, "")
    assert words in err
    report = status_of(path)
    assert report["server"]["draining"] is None
    assert [g["draining"] for g in report["gpus"]] == [None, None]
    assert not (sockdir / "s.sock.drain").exists()


def test_the_wire_refuses_a_reason_it_cannot_show(
    start_server: StartServer, sockdir: Path, peers: list[Peer]
) -> None:
    path = sockdir / "s.sock"
    start_server("--gpus", "1", socket=path)
    client = _peer(path, peers)
    client.send({"op": "drain", "req": 1, "gpus": [], "reason": "a\u202eb"})
    reply = client.answer(1)
    assert (reply["op"], reply["code"]) == ("error", "bad_message")
    assert "reason must be printable" in reply["message"]
    client.send({"op": "drain", "req": 2, "gpus": [0, 0]})
    assert "GPU 0 more than once" in client.answer(2)["message"]
    assert status_of(path)["server"]["draining"] is None


def test_a_member_who_is_not_an_admin_is_refused_and_nothing_changes(
    users: Users, start_server: StartServer, sockdir: Path
) -> None:
    group = users.group()
    alice = users.user([group])
    sockdir.chmod(0o755)
    path = sockdir / "s.sock"
    server = start_server("--gpus", "2", "--group", str(group), socket=path)
    env = users.env(HWPOOL_SOCKET=str(path), HWPOOL_AUTOSTART="0", HWPOOL_SYSTEM_SOCKET="")
    for args in (("drain", "--reason", "mine now"), ("drain", "--gpu", "1"), ("resume",)):
        done = subprocess.run(
            users.command(alice, ["-m", "hwpool", *args]), capture_output=True, text=True,
            env=env, timeout=BOUND * 3, check=False, cwd="/",
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert "only an admin of this server" in line
        assert alice.name in line
    report = status_of(path)
    assert report["server"]["draining"] is None
    assert [g["draining"] for g in report["gpus"]] == [None, None]
    assert not (sockdir / "s.sock.drain").exists()
    assert not [line for line in server.lines if " drain " in line or " resume " in line]
    # Root, an admin, may: the one same command.
    assert _hwpool("drain", "--socket", str(path), "--gpu", "1")[0] == 0
    assert json.loads((sockdir / "s.sock.drain").read_text())["gpus"] == [[1, ""]]
    assert os.stat(sockdir / "s.sock.drain").st_uid == os.geteuid()


def test_a_queued_job_of_a_drained_server_says_it_waits_for_the_drain(
    start_server: StartServer,
    sockdir: Path,
    peers: list[Peer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = sockdir / "s.sock"
    start_server("--gpus", "1", socket=path)
    assert _hwpool("drain", "--socket", str(path), "--reason", "driver update")[0] == 0
    with JobStore.open(tmp_path / "state") as store:
        job = store.add(["python", "train.py"], environment={}, cwd="/srv")
    # The supervisor labels a queued job's request "jN NAME": the GPU is free, but drained.
    peer = _peer(path, peers)
    peer.send({**acquire(1), "name": f"{job.id} train"})
    _queued(peer, 1, 2)
    monkeypatch.setenv("HWPOOL_SOCKET", str(path))
    monkeypatch.delenv("HWPOOL_SYSTEM_SOCKET", raising=False)
    me = pwd.getpwuid(os.getuid()).pw_name
    wait = job_waits([(me, job)])[me, job.id]
    assert (wait.reason, wait.detail, wait.estimated_start) == ("draining", "driver update", None)
    said = {"reason": wait.reason, "reason_detail": wait.detail, "estimated_start": None}
    assert wait_words(said) == "draining: driver update; start unknown"


def test_a_member_of_the_admin_group_is_an_admin(
    users: Users, start_server: StartServer, sockdir: Path
) -> None:
    """``--admin-group``: its members may drain and cancel anyone's request; other members of
    the server's group may not (both real users, the server root's)."""
    served, admins = users.group(), users.group()
    alice = users.user([served, admins])
    bob = users.user([served])
    sockdir.chmod(0o755)
    path = sockdir / "s.sock"
    server = start_server(
        "--gpus", "1", "--group", str(served), "--admin-group", str(admins), socket=path
    )
    assert any(f"admin group {admins}" in line for line in server.lines)
    env = users.env(HWPOOL_SOCKET=str(path), HWPOOL_AUTOSTART="0", HWPOOL_SYSTEM_SOCKET="")

    def hwpool_as(user: object, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            users.command(user, ["-m", "hwpool", *args]),  # type: ignore[arg-type]
            capture_output=True, text=True, env=env, timeout=BOUND * 3, check=False, cwd="/",
        )  # fmt: skip

    refused = hwpool_as(bob, "drain", "--reason", "mine now")
    assert refused.returncode == 1 and "only an admin of this server" in refused.stderr
    assert status_of(path)["server"]["draining"] is None
    done = hwpool_as(alice, "drain", "--reason", "driver update")
    assert done.returncode == 0, done.stderr
    assert status_of(path)["server"]["draining"] == "driver update"
    assert any(" drain " in line and alice.name in line for line in server.lines)
    assert hwpool_as(alice, "resume").returncode == 0
    assert status_of(path)["server"]["draining"] is None


@pytest.mark.parametrize("value", ["no-such-group-hwpool", "-1"])
def test_a_bad_admin_group_is_refused_naming_it(value: str, tmp_path: Path) -> None:
    code, out, err = run_cli(
        "serve", "--socket", str(tmp_path / "s.sock"), "--gpus", "1", "--admin-group", value,
        "--check-config",
    )  # fmt: skip
    assert code == 2 and out == "" and "--admin-group" in err and value in err
