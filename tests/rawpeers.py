"""Raw protocol clients for the server tests, run as this user or as another real Unix user.

``talk`` speaks the wire protocol on a socket of its own (no client library in between), so
a test can send exactly what a hostile or confused client would. ``talk_as`` talks as another
real Unix user (made with tests/users.py), from a forked child: the interpreter may live where
other users cannot run it (/root), so nothing is executed anew.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hostserver import BOUND
from hwpool._core._capacity import UNITS_PER_GPU


def hello(token: str | None = None, role: str | None = None) -> dict[str, object]:
    """A hello message, with a token and a role when given."""
    out: dict[str, object] = {"op": "hello", "version": 1, "client": "test"}
    if token is not None:
        out["token"] = token
    if role is not None:
        out["role"] = role
    return out


def acquire(req: int, count: int = 1, units: int = UNITS_PER_GPU) -> dict[str, object]:
    """A waiting acquire: ``count`` GPUs (whole ones if more than one) of ``units`` each."""
    return {"op": "acquire", "req": req, "count": count, "units": units, "wait": True}


def lines(messages: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def read_until(sock: socket.socket, req: object, replies: list[dict[str, Any]]) -> None:
    """Read into ``replies`` until the final answer to ``req`` (not a ``queued``) is there."""
    data = b""
    while not any(r.get("req") == req and r["op"] not in ("queued", "welcome") for r in replies):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {replies}"
        data += chunk
        *complete, data = data.split(b"\n")
        replies += [json.loads(line) for line in complete]


def talk(path: Path, messages: list[dict[str, object]]) -> list[dict[str, Any]]:
    """Connect, send ``messages`` (a hello first), and read the replies until one answers
    the last message's ``req``; then close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(BOUND)
        sock.connect(str(path))
        sock.sendall(lines(messages))
        replies: list[dict[str, Any]] = []
        read_until(sock, messages[-1]["req"], replies)
        return replies


def reply_to(replies: list[dict[str, Any]], req: int) -> dict[str, Any]:
    """The one final reply to ``req`` among ``replies``."""
    (found,) = [r for r in replies if r.get("req") == req and r["op"] not in ("welcome", "queued")]
    return found


@dataclass(frozen=True)
class Pair:
    """Two real Unix users (see tests/users.py) who share one group of their own."""

    alice: int
    bob: int
    gid: int


def become(uid: int, gid: int) -> None:
    """In a forked child: drop every group and become ``uid`` in group ``gid``."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def talk_as(uid: int, gid: int, path: Path, messages: list[dict[str, object]]) -> list[Any]:
    """``talk(path, messages)`` from a forked child that became ``uid``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pipe
        try:
            become(uid, gid)
            os.write(write, json.dumps(talk(path, messages)).encode())
        except BaseException as exc:
            os.write(write, json.dumps(f"{type(exc).__name__}: {exc}").encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        got = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert isinstance(got, list), got
    return got


def connect_as(uid: int, gid: int, path: Path) -> socket.socket:
    """A connection to ``path`` made by ``uid`` (the server sees its SO_PEERCRED), held open
    by this process: a forked child becomes ``uid``, connects, and hands the socket back
    over a socket pair (SCM_RIGHTS), so the test can talk on it as long as it likes."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reports through the pair
        try:
            parent.close()
            become(uid, gid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
                socket.send_fds(child, [b"ok"], [sock.fileno()])
        except BaseException as exc:
            child.sendall(f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(0)
    child.close()
    with parent:
        parent.settimeout(BOUND)
        message, fds, _, _ = socket.recv_fds(parent, 4096, 1)
    os.waitpid(pid, 0)
    assert message == b"ok" and len(fds) == 1, message
    sock = socket.socket(fileno=fds[0])
    sock.settimeout(BOUND)
    return sock


class Peer:
    """A raw-protocol connection held open: send messages, read what comes until a reply."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.replies: list[dict[str, Any]] = []

    def send(self, *messages: dict[str, object]) -> None:
        self.sock.sendall(lines(list(messages)))

    def answer(self, req: int) -> dict[str, Any]:
        """The final reply to ``req`` (read until it came; bounded by the socket timeout)."""
        read_until(self.sock, req, self.replies)
        return reply_to(self.replies, req)

    def close(self) -> None:
        self.sock.close()


class LinePeer:
    """A raw protocol client that stays connected and reads one line at a time, as this user
    (:class:`Peer` reads on until the reply to a given request instead)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(BOUND)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rwb")
        self.send(hello())
        assert self.read()["op"] == "welcome"

    def send(self, message: dict[str, Any]) -> None:
        self.file.write(json.dumps(message).encode() + b"\n")
        self.file.flush()

    def read(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line, "the server closed the connection"
        return json.loads(line)  # type: ignore[no-any-return]

    def acquire(self, req: int, count: int = 1, units: int = UNITS_PER_GPU, **more: Any) -> str:
        """Ask for ``count`` GPUs of ``units`` each (``more``: a name, a priority...); the
        reply's op (granted, queued)."""
        self.send({**acquire(req, count, units), **more})
        return str(self.read()["op"])

    def close(self) -> None:
        self.file.close()
        self.sock.close()
