"""``hwpool status`` and ``hwpool cancel`` on a shared box, against real ``hwpool serve`` processes.

A status answer of any size comes whole and never costs the asker its connection (item 4 of
issue 22); what one user wrote reaches another's terminal escaped, and command lines only
their owner and admins (item 11); cancel takes several ids, ``--name`` and ``--mine``; a
closed pipe ends a printing command quietly.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hostserver import BOUND, ENV, Server, run_cli, status_of
from hwpool import connect as hwpool_connect
from hwpool._backends._unix import UnixBackend
from hwpool._cli._host_cmds import ID_NOTE
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._core._scheduler import Demand
from hwpool._server._host_entries import Client
from hwpool._server._host_state import HostState
from hwpool._server._server import MAX_BUFFERED, _Connection
from hwpool._wire import _protocol as p
from hwpool._wire._protocol import MAX_LINE, MAX_TEXT
from users import User, Users

StartServer = Callable[..., Server]
FULL = UNITS_PER_GPU
HELLO = b'{"op":"hello","version":1,"client":"test"}\n'


# ----------------------------------------------------------------- raw clients
class Raw:
    """A bare protocol client on its own connection: lines out, lines in, nothing hidden."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(BOUND)
        self.sock.connect(str(path))
        self.pending = b""
        self.sock.sendall(HELLO)
        assert self.read()["op"] == "welcome"

    def send(self, *messages: dict[str, Any]) -> None:
        lines = (json.dumps(m, separators=(",", ":")).encode() + b"\n" for m in messages)
        self.sock.sendall(b"".join(lines))

    def read(self) -> dict[str, Any]:
        """The next message; AssertionError if the server closed the connection."""
        while b"\n" not in self.pending:
            chunk = self.sock.recv(1 << 16)
            assert chunk, f"the server closed the connection after {self.pending[:200]!r}"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        assert len(line) < MAX_LINE
        return json.loads(line)  # type: ignore[no-any-return]

    def line_length(self) -> int:
        """The length of the next line, newline included (it is consumed)."""
        while b"\n" not in self.pending:
            chunk = self.sock.recv(1 << 16)
            assert chunk, "the server closed the connection"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return len(line) + 1

    def close(self) -> None:
        self.sock.close()


def acquire(req: int, units: int = FULL, **labels: object) -> dict[str, Any]:
    return {"op": "acquire", "req": req, "count": 1, "units": units, "wait": True, **labels}


@pytest.fixture
def one_gpu(start_server: StartServer) -> Server:
    return start_server("--gpus", "1")


@pytest.fixture
def raws() -> Iterator[Callable[[Path], Raw]]:
    opened: list[Raw] = []

    def open_raw(path: Path) -> Raw:
        opened.append(Raw(path))
        return opened[-1]

    yield open_raw
    for raw in opened:
        raw.close()


def queue_up(raw: Raw, names: list[str], command: str) -> None:
    """Queue one waiter per name on ``raw`` (the GPU is held), and read every ``queued``."""
    raw.send(*(acquire(req, name=name, command=command) for req, name in enumerate(names, 1)))
    for _ in names:
        assert raw.read()["op"] == "queued"


# ----------------------------------------------------------------- item 4: any size
def test_a_status_of_2000_long_waiters_comes_whole_and_the_asker_keeps_its_lease(
    one_gpu: Server, raws: Callable[[Path], Raw]
) -> None:
    holder = UnixBackend(one_gpu.socket, name="holder")
    grant = holder.acquire_blocking(Demand(1, FULL), BOUND)
    lease_id = holder.lease_id(grant.ticket)
    names = []
    for k in range(4):  # 2000 waiters of 4 KiB of text each: 8 MiB of status, 4 connections
        batch = [f"{k}-{n}-" + "n" * 2000 for n in range(500)]
        queue_up(raws(one_gpu.socket), batch, "c" * 2000)
        names += batch
    snapshot = holder.snapshot()  # asked over the holder's own connection, streamed
    assert len(snapshot.waiting) == 2000
    report = status_of(one_gpu.socket)  # `hwpool status --json`
    assert [w["name"] for w in report["waiting"]] == names
    assert [(x["id"], x["pid"], x["name"]) for x in report["leases"]] == [
        (lease_id, os.getpid(), "holder")
    ]
    assert holder.lease_id(grant.ticket) == lease_id  # still held: its connection lives
    holder.release(grant)
    assert status_of(one_gpu.socket)["leases"][0]["name"] == names[0]  # handed on in order
    holder.close()


def test_a_client_that_does_not_ask_for_a_stream_gets_one_line_cut_to_fit(
    one_gpu: Server, raws: Callable[[Path], Raw]
) -> None:
    holder = raws(one_gpu.socket)
    holder.send(acquire(1))
    assert holder.read()["op"] == "granted"
    names = [f"{n:02}" + "x" * (MAX_TEXT - 2) for n in range(16)]  # 16 names of 4 KiB
    queue_up(raws(one_gpu.socket), names, "y")
    holder.send({"op": "status", "req": 2})  # a client of before streaming: one line
    reply = holder.read()
    assert reply["op"] == "status" and reply["req"] == 2
    assert len(reply["waiting"]) + reply["waiting_left_out"] == 16 > len(reply["waiting"])
    assert [w["name"] for w in reply["waiting"]] == names[: len(reply["waiting"])]
    assert len(reply["leases"]) == 1 and reply["leases_left_out"] == 0
    holder.send({"op": "status", "req": 3, "stream": True})
    parts = []
    while (message := holder.read())["op"] == "status_part":
        parts.append(message)
    assert message["op"] == "status" and message["req"] == 3 and len(parts) >= 2
    assert sum(len(part["waiting"]) for part in parts) == 16


def test_a_reply_quoting_a_huge_field_is_cut_and_the_connection_goes_on(
    one_gpu: Server, raws: Callable[[Path], Raw]
) -> None:
    holder = raws(one_gpu.socket)
    holder.send(acquire(1))
    assert holder.read()["op"] == "granted"
    holder.send(acquire(2, name=[1] * 30_000))  # 60 KB; its error quotes it in 90 KB
    error = holder.read()
    assert (error["op"], error["code"], error["req"]) == ("error", "bad_message", 2)
    assert "name must be a string" in error["message"]
    holder.send({"op": "status", "req": 3})  # still connected, still holding its lease
    assert holder.read()["leases"][0]["id"] == 1


def test_a_name_utf8_cannot_carry_is_refused_so_status_still_encodes(
    one_gpu: Server, raws: Callable[[Path], Raw]
) -> None:
    holder = raws(one_gpu.socket)
    holder.send(acquire(1))
    assert holder.read()["op"] == "granted"
    sneaky = raws(one_gpu.socket)
    sneaky.sock.sendall(
        b'{"op":"acquire","req":1,"count":1,"units":5,"wait":true,"name":"\\udcff"}\n'
    )
    error = sneaky.read()
    assert (error["code"], error["req"]) == ("bad_message", 1)
    assert "lone surrogate" in error["message"]
    holder.send({"op": "status", "req": 2})
    reply = holder.read()
    assert reply["op"] == "status" and [x["id"] for x in reply["leases"]] == [1]


def test_a_client_that_reads_a_long_status_slowly_is_not_dropped(
    one_gpu: Server, raws: Callable[[Path], Raw]
) -> None:
    """8 MiB of status is more than a client may leave unread (4 MiB); streamed as it reads,
    it all comes, to a client that sleeps on nothing but its own reads."""
    holder = raws(one_gpu.socket)
    holder.send(acquire(1))
    assert holder.read()["op"] == "granted"
    for k in range(2):
        queue_up(raws(one_gpu.socket), [f"{k}-{n}" + "n" * 4000 for n in range(500)], "c" * 4000)
    holder.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    holder.send({"op": "status", "req": 2, "stream": True}, {"op": "status", "req": 3})
    total = 0
    while True:
        length = holder.line_length()
        total += length
        if length < 1000:  # the closing status line (no records; its owners: one uid)
            break
    assert total > 8_000_000
    second = holder.read()  # the one-line status asked after it, behind it in order
    assert second["req"] == 3 and second["waiting_left_out"] > 0


# ----------------------------------------------------------------- item 11: what others see
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\n  #99 root pid 1: GPU 0, held 1.0 s\u202e"


@dataclass(frozen=True)
class Other:
    """Another real Unix user (tests/users.py), and how to run Python as it."""

    user: User
    users: Users

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def uid(self) -> int:
        return self.user.uid

    @property
    def gid(self) -> int:
        return self.user.gid

    def command(self, args: list[str]) -> list[str]:
        return self.users.command(self.user, args)


def hwpool(*args: str, user: Other | None = None) -> subprocess.CompletedProcess[str]:
    """The real ``hwpool`` command, as ``user`` (default: this process's)."""
    argv = ["-m", "hwpool", *args]
    return subprocess.run(
        [sys.executable, *argv] if user is None else user.command(argv),
        capture_output=True, text=True, env=ENV if user is None else user.users.env(),
        timeout=BOUND, check=False,
    )  # fmt: skip


def assert_inert(text: str) -> None:
    """Nothing in ``text`` can drive a terminal: no control or format character but newline."""
    assert all(c == "\n" or c.isprintable() for c in text), repr(text)


def test_status_text_escapes_names_and_commands(one_gpu: Server) -> None:
    backend = UnixBackend(one_gpu.socket, name=HOSTILE, command="run \x1b[31m --x\r")
    grant = backend.acquire_blocking(Demand(1, FULL), BOUND)
    proc = hwpool("status", "--socket", str(one_gpu.socket))
    assert proc.returncode == 0, proc.stderr
    assert_inert(proc.stdout)
    leases = [line for line in proc.stdout.splitlines() if line.startswith("  #")]
    assert len(leases) == 1  # the newline in the name forged no second lease line
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\n  #99 root" in leases[0] and "\\u202e" in leases[0]
    assert "run \\x1b[31m --x\\r" in leases[0]
    assert (
        json.loads(hwpool("status", "--socket", str(one_gpu.socket), "--json").stdout)["leases"][0][
            "name"
        ]
        == HOSTILE
    )  # JSON carries it as it is, safely quoted
    backend.release(grant)
    backend.close()


@pytest.fixture
def other_user(users: Users) -> Other:
    return Other(users.user(), users)


class Holder:
    """A process of ``user`` that holds one whole GPU with a name and a command line."""

    SCRIPT = (
        "import sys\n"
        "from hwpool._backends._unix import UnixBackend\n"
        "from hwpool._core._scheduler import Demand\n"
        "from hwpool._core._capacity import UNITS_PER_GPU\n"
        "b = UnixBackend(sys.argv[1], name=sys.argv[2], command=sys.argv[3])\n"
        "b.acquire_blocking(Demand(1, UNITS_PER_GPU), 10.0)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )

    def __init__(self, user: Other, path: Path, name: str, command: str) -> None:
        argv = ["-c", self.SCRIPT, str(path), name, command]
        self.proc = subprocess.Popen(
            user.command(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=user.users.env(),
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded: its acquire has a 10 s timeout
        assert line == "held\n", self.proc.stderr.read() if self.proc.stderr else line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=BOUND)


def test_another_user_sees_names_but_not_command_lines_and_cancels_only_its_own(
    start_server: StartServer, sockdir: Path, other_user: Other
) -> None:
    path = sockdir / "shared" / "s.sock"
    server = start_server("--gpus", "3", "--group", str(other_user.gid), socket=path)
    os.chmod(sockdir, 0o755)  # the other user may reach the server's directory
    root = UnixBackend(path, name="root-job", command="train --token=ROOTSECRET")
    root.acquire_blocking(Demand(1, FULL), BOUND)
    theirs = Holder(other_user, path, HOSTILE, "serve --password=THEIRSECRET")
    try:
        seen = json.loads(hwpool("status", "--socket", str(path), "--json", user=other_user).stdout)
        shown = {x["user"]: (x["name"], x["command"]) for x in seen["leases"]}
        assert shown == {
            "root": ("root-job", None),  # another user's command line is not shown
            other_user.name: (HOSTILE, "serve --password=THEIRSECRET"),  # its own is
        }
        text = hwpool("status", "--socket", str(path), user=other_user).stdout
        assert "ROOTSECRET" not in text and "[root-job]" in text and "THEIRSECRET" in text
        as_root = hwpool("status", "--socket", str(path))  # an admin sees every command line
        assert "ROOTSECRET" in as_root.stdout and "THEIRSECRET" in as_root.stdout
        assert_inert(as_root.stdout)
        assert len([ln for ln in as_root.stdout.splitlines() if ln.startswith("  #")]) == 2

        root_id = next(x["id"] for x in seen["leases"] if x["user"] == "root")
        refused = hwpool("cancel", str(root_id), "--socket", str(path), user=other_user)
        assert refused.returncode == 2 and "only its owner or an admin" in refused.stderr
        by_name = hwpool("cancel", "--name", "root-job", "--socket", str(path), user=other_user)
        assert (
            by_name.returncode == 0 and "nothing to cancel: no request of yours" in by_name.stdout
        )
        mine = hwpool("cancel", "--mine", "--socket", str(path), user=other_user)
        assert mine.returncode == 0, mine.stderr
        (line,) = mine.stdout.splitlines()
        assert line.startswith("#") and f"revoked the lease of {other_user.name} pid" in line
        assert_inert(mine.stdout)
        assert [x["name"] for x in status_of(path)["leases"]] == ["root-job"]
        server.wait_for(f'revoke #{seen["leases"][1]["id"]} "evil\\x1b]0;pwned')  # escaped
        server.wait_for(f"by {other_user.name} (uid {other_user.uid})")
    finally:
        theirs.stop()
        root.close()


# ----------------------------------------------------------------- cancel
def test_cancel_takes_several_ids_and_says_what_happened_to_each(one_gpu: Server) -> None:
    backend = UnixBackend(one_gpu.socket, name="job")
    grant = backend.acquire_blocking(Demand(1, FULL), BOUND)
    lease_id = backend.lease_id(grant.ticket)
    waiter = Raw(one_gpu.socket)
    queue_up(waiter, ["queued-one"], "cmd")
    waiter_id = status_of(one_gpu.socket)["waiting"][0]["id"]
    code, out, err = run_cli(
        "cancel", str(waiter_id), str(lease_id), "999", str(waiter_id), "--socket",
        str(one_gpu.socket),
    )  # fmt: skip
    pid = os.getpid()
    assert code == 2  # one of them was refused
    assert out.splitlines() == [
        f"#{waiter_id}: withdrew the waiting request of root pid {pid} [queued-one]",
        f"#{lease_id}: revoked the lease of root pid {pid} [job]: its GPUs are free once its "
        "processes are gone",
    ]
    assert err == "hwpool: error: no lease or waiter #999\n"  # and an id given twice, once
    assert waiter.read()["code"] == "cancelled"
    waiter.close()
    backend.close()


def test_cancel_by_name_and_all_of_mine(one_gpu: Server) -> None:
    holder = Raw(one_gpu.socket)
    holder.send(acquire(1, name="keep"))
    assert holder.read()["op"] == "granted"
    waiters = Raw(one_gpu.socket)
    queue_up(waiters, ["sweep", "keep", "sweep"], "c")
    path = str(one_gpu.socket)
    code, out, _ = run_cli("cancel", "--name", "sweep", "--socket", path)
    assert code == 0 and len(out.splitlines()) == 2 and "[sweep]" in out and "[keep]" not in out
    assert [w["name"] for w in status_of(one_gpu.socket)["waiting"]] == ["keep"]
    code, out, _ = run_cli("cancel", "--mine", "--socket", path)
    assert code == 0 and len(out.splitlines()) == 2  # the lease and the waiter left
    assert status_of(one_gpu.socket)["leases"] == []
    assert run_cli("cancel", "--mine", "--socket", path) == (
        0, "hwpool cancel: nothing to cancel: no request of yours\n", "",
    )  # fmt: skip
    holder.close()
    waiters.close()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "give the ids to cancel, --name NAME or --mine"),
        (("0",), "got 0"),
        (("x1",), "'x1'"),
    ],
)
def test_bad_cancel_usage_is_exit_2_in_one_line(
    one_gpu: Server, args: tuple[str, ...], fragment: str
) -> None:
    code, out, err = run_cli("cancel", *args, "--socket", str(one_gpu.socket))
    assert code == 2 and out == "" and fragment in err and err.count("\n") == 1


# ----------------------------------------------------------------- a reader that goes away
@pytest.mark.parametrize("command", [("status",), ("status", "--json"), ("info",)])
def test_a_closed_pipe_ends_a_printing_command_quietly(
    one_gpu: Server, command: tuple[str, ...]
) -> None:
    argv = [sys.executable, "-m", "hwpool", *command]
    if command[0] == "status":
        argv += ["--socket", str(one_gpu.socket)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before a byte is written (`| head -0`)
    _, err = proc.communicate(timeout=BOUND)
    assert (proc.returncode, err) == (0, b"")


def test_status_into_head_exits_quietly_with_a_long_queue(
    one_gpu: Server, raws: Callable[[Path], Raw]
) -> None:
    holder = raws(one_gpu.socket)
    holder.send(acquire(1))
    assert holder.read()["op"] == "granted"
    queue_up(raws(one_gpu.socket), [f"{n}" + "n" * 1000 for n in range(300)], "c")  # > a pipe
    shell = f"{sys.executable} -m hwpool status --socket {one_gpu.socket} | head -1"
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, env=ENV,
        timeout=BOUND, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("hwpool server on ")


# ----------------------------------------------------------------- the connection's writer
class FakeTransport:
    """What a connection writes, and a buffer size the test sets."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.buffered = 0
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.lines.append(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


class FakeServer:
    def __init__(self) -> None:
        self.said: list[str] = []

    def say(self, line: str) -> None:
        self.said.append(line)

    def who(self, uid: int) -> str:
        return f"uid {uid}"


def connection() -> tuple[Any, FakeTransport, FakeServer]:
    server, transport = FakeServer(), FakeTransport()
    conn = _Connection(server)  # type: ignore[arg-type]
    conn.transport = transport  # type: ignore[assignment]
    return conn, transport, server


def test_a_reply_that_cannot_be_encoded_becomes_an_error_and_the_connection_stays() -> None:
    conn, transport, server = connection()
    bad = p.StatusReply(7, (0,), (), (p.WaiterRecord(1, 0, 1, 1, 5, (), 0.0, "\udcff"),),
                        0, 0, 0, 0, 0.0, 0.0)  # fmt: skip
    conn.send(bad)
    (line,) = transport.lines
    reply = p.decode_server(line)
    assert isinstance(reply, p.ErrorReply) and reply.req == 7
    assert reply.code is p.ErrorCode.REPLY_FAILED and not reply.code.fatal
    assert not (conn.closed or transport.closed or transport.aborted)
    assert "cannot send a status message" in server.said[0] and "\\udcff" in server.said[0]
    conn.send(p.Done(8))
    assert p.decode_server(transport.lines[-1]) == p.Done(8)


def test_while_the_client_reads_slowly_replies_keep_their_order_behind_a_status() -> None:
    async def scenario() -> None:
        conn, transport, _ = connection()
        conn.pause_writing()  # the transport's buffer is full
        conn.send(p.Queued(1, 5))
        conn.stream(iter([b"part-1\n", b"part-2\n", b"part-3\n"]))
        conn.send(p.Granted(1, 5, (0,), 9))
        assert transport.lines == []
        conn.resume_writing()
        assert transport.lines == [p.encode(p.Queued(1, 5)), b"part-1\n"]  # one line a turn
        for _ in range(10):  # bounded: a few turns of the loop
            await asyncio.sleep(0)
        assert transport.lines == [p.encode(p.Queued(1, 5)), b"part-1\n", b"part-2\n",
                                   b"part-3\n", p.encode(p.Granted(1, 5, (0,), 9))]  # fmt: skip
        assert not conn.backlog and conn.backlog_bytes == 0

    asyncio.run(scenario())


def test_a_client_that_leaves_too_much_unread_is_dropped() -> None:
    conn, transport, server = connection()
    conn.pause_writing()
    transport.buffered = MAX_BUFFERED - 10
    conn.send(p.Queued(1, 5))
    assert transport.aborted and conn.closed and "does not read its replies" in server.said[0]


# ----------------------------------------------------------------- labels the wire can carry
def test_hwpool_run_with_bytes_that_are_not_utf8_sends_them_escaped(one_gpu: Server) -> None:
    argv = [sys.executable.encode(), b"-m", b"hwpool", b"run", b"--socket",
            bytes(one_gpu.socket), b"--no-start", b"--name", b"n\xff",
            b"--", b"true", b"\xff"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, env=ENV, timeout=BOUND, check=False)
    assert proc.returncode == 0, proc.stderr
    one_gpu.wait_for('grant #1 "n\\xff" to root')


def test_a_label_utf8_cannot_carry_is_refused_by_name(one_gpu: Server) -> None:
    with pytest.raises(ValueError, match=r"name must be text UTF-8 can carry, got 'a\\\\udcff'"):
        UnixBackend(one_gpu.socket, name="a\udcff")


def test_a_client_that_asks_for_status_after_status_without_reading_is_dropped() -> None:
    conn, transport, server = connection()
    conn.pause_writing()  # it reads nothing
    asked = 0
    while not transport.aborted:
        conn.stream(iter([b"never\n"]))  # each costs the server a little until it begins
        asked += 1
        assert asked <= MAX_BUFFERED // 1024 + 1
    assert asked > 1000 and "does not read its replies" in server.said[0]


def test_status_records_are_built_as_they_are_sent_from_one_moment() -> None:
    state = HostState(1)
    holder = Client(1, 1000, 5)
    state.acquire(holder, p.Acquire(1, 1, FULL, True, "held"), 0.0)
    for req in range(2, 5):
        state.acquire(holder, p.Acquire(req, 1, FULL, True, f"w{req}"), 0.0)
    reply = state.status(7, 2.0, 0.0)
    state.release(holder, p.Release(9, 1), 3.0)  # after the status: #2 is granted now
    lines = list(p.status_lines(reply, stream=True))
    *parts, last = map(p.decode_server, lines)
    whole = p.join_status(parts, last)  # type: ignore[arg-type]
    assert [(x.id, x.name, x.age_s) for x in whole.leases] == [(1, "held", 2.0)]
    assert [(w.id, w.age_s) for w in whole.waiting] == [(2, 2.0), (3, 2.0), (4, 2.0)]


def test_status_says_which_ids_are_the_servers_and_which_are_jobs_once_it_shows_any(
    one_gpu: Server,
) -> None:
    """``#N`` are the server's ids, ``jN`` job ids (issue 24): said under a status that
    lists leases or waiters, and only then."""
    empty = run_cli("status", "--socket", str(one_gpu.socket))[1]
    assert "hwpool cancel jN" not in empty
    with hwpool_connect(one_gpu.socket) as pool, pool.lease(0.5):
        shown = run_cli("status", "--socket", str(one_gpu.socket))[1]
    assert shown.rstrip().splitlines()[-1] == ID_NOTE
