"""A client's end of one connection to ``hwpool serve``: connect, hello, send and read lines.

Blocking sockets only; the unix backend reads from a thread, ``hwpool status`` and
``hwpool cancel`` read inline. A server that is absent, refuses this user or speaks another
protocol version is reported as a ``ConnectionError`` that names the socket and what to do.
The server is verified before anything is sent to it, the hello included (``_safety``: the
socket's directory, then the uid of the process listening): an impostor is refused with an
``UntrustedServerError`` and learns nothing, not even that this client exists.
"""

from __future__ import annotations

import collections
import contextlib
import grp
import os
import socket
import stat
from pathlib import Path

from .._version import __version__
from ._paths import SOCKET_VAR, system_socket
from ._protocol import (
    PROTOCOL_VERSION,
    ErrorReply,
    Hello,
    LineBuffer,
    ProtocolError,
    Role,
    ServerMessage,
    Status,
    StatusPart,
    StatusReply,
    Welcome,
    decode_server,
    encode,
    join_status,
)
from ._safety import UntrustedServerError, server_uids, verify_peer

__all__ = ["NotServedError", "UntrustedServerError", "Wire", "no_server_error"]

CONNECT_TIMEOUT_S = 10.0


def no_server_error(path: Path, reason: str) -> ConnectionError:
    """The error for a socket nobody serves, saying how to start a server there."""
    with contextlib.suppress(ValueError):
        if path == system_socket():
            return ConnectionError(
                f"the machine-wide hwpool server on {str(path)!r} is not running ({reason}); "
                "ask its admin to start it (no per-user server is started while one is "
                f"set up there), or set {SOCKET_VAR} to use another server"
            )
    how = "hwpool serve" if os.environ.get("HWPOOL_SOCKET") else f"hwpool serve --socket {path}"
    return ConnectionError(
        f"no hwpool server on {str(path)!r} ({reason}); start one with `{how}` "
        "(or point HWPOOL_SOCKET at a machine-wide one)"
    )


class NotServedError(ConnectionError):
    """The server does not serve this user: the socket is closed to them (not a member of
    the group it serves), or the server refused them at the hello. Another server of their
    own is no answer on a shared machine (it would share out the same GPUs again): the
    message names the group to join where it can."""


NOT_SERVED = "may not use this server"
"""What the server's refusal at the hello says of a uid it does not serve."""


def not_served_error(path: Path, refusal: str | None = None) -> NotServedError:
    """The error for a server on ``path`` that does not serve this user: with the server's
    ``refusal`` (it names the group it serves), or, for a socket closed to this user, naming
    the group that its directory admits."""
    where = f"the hwpool server on {str(path)!r}"
    if refusal is not None:
        return NotServedError(f"{where}: {refusal}")
    group = _served_group(path)
    if group is None:
        return NotServedError(
            f"{where} does not serve you (permission denied): ask its admin to let you use it"
        )
    return NotServedError(
        f"{where} serves only its owner and the members of group {group!r}, and you are not "
        f"one: ask its admin to add you to {group!r} (then log in again)"
    )


def _served_group(path: Path) -> str | None:
    """The name of the group the socket's directory admits (mode g+x), or None."""
    try:
        info = os.stat(path.parent)
    except OSError:
        return None
    if not info.st_mode & stat.S_IXGRP:
        return None
    try:
        return grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        return f"gid {info.st_gid}"


class Wire:
    """One connected, welcomed socket. ``read`` blocks for the next server message.

    ``token`` names the client across reconnects (see the hello); ``role`` ``control`` is for
    a connection that only asks for status and cancels, which the server admits even when
    this user has as many connections as it allows.
    """

    def __init__(
        self, path: Path, timeout: float = CONNECT_TIMEOUT_S, *, token: str | None = None,
        role: Role = "data",
    ) -> None:  # fmt: skip
        """Connect to ``path`` and exchange hellos; ConnectionError if that fails."""
        self.path = path
        self._hello = Hello(PROTOCOL_VERSION, f"hwpool {__version__}", token, role, notices=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._buffer = LineBuffer()
        self._lines: collections.deque[bytes] = collections.deque()
        try:
            self.welcome = self._open(timeout)
        except BaseException:
            self.sock.close()
            raise

    def _open(self, timeout: float) -> Welcome:
        self.sock.settimeout(timeout)
        try:
            allowed = server_uids(self.path)
            self.sock.connect(os.fspath(self.path))
            verify_peer(self.sock, self.path, allowed)
        except UntrustedServerError:
            raise
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise no_server_error(self.path, exc.strerror or str(exc)) from None
        except PermissionError:
            raise not_served_error(self.path) from None
        except OSError as exc:
            raise ConnectionError(f"cannot connect to {str(self.path)!r}: {exc}") from None
        try:
            self.send_bytes(encode(self._hello))
        except OSError as exc:  # refused at once? its reason may be waiting to be read
            try:
                reply = self.read()
            except ConnectionError:
                raise ConnectionError(f"cannot talk to {str(self.path)!r}: {exc}") from None
        else:
            reply = self.read()
        if isinstance(reply, ErrorReply) and NOT_SERVED in reply.message:
            raise not_served_error(self.path, reply.message)
        if isinstance(reply, ErrorReply):
            raise ConnectionError(f"the hwpool server on {str(self.path)!r}: {reply.message}")
        if not isinstance(reply, Welcome):
            raise ConnectionError(f"the hwpool server on {str(self.path)!r} did not welcome us")
        self.sock.settimeout(None)
        return reply

    def send_bytes(self, line: bytes) -> None:
        """Send one encoded line (OSError if the connection is gone)."""
        self.sock.sendall(line)

    def read(self) -> ServerMessage:
        """The next message; ConnectionError when the server closed or spoke nonsense."""
        while not self._lines:
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                raise ConnectionError(
                    f"the hwpool server on {str(self.path)!r} timed out"
                ) from None
            except OSError as exc:
                raise ConnectionError(
                    f"lost the hwpool server on {str(self.path)!r}: {exc}"
                ) from None
            if not data:
                raise ConnectionError(
                    f"the hwpool server on {str(self.path)!r} closed the connection"
                )
            try:
                self._lines.extend(self._buffer.feed(data))
            except ProtocolError as exc:
                raise ConnectionError(f"bad data from {str(self.path)!r}: {exc}") from None
        try:
            return decode_server(self._lines.popleft())
        except ProtocolError as exc:
            raise ConnectionError(f"bad message from {str(self.path)!r}: {exc}") from None

    def read_batch(self) -> list[ServerMessage]:
        """The next message (blocking for it) and every other one already received, so that
        the reader hands them over together; ConnectionError as ``read``. A line that does
        not decode ends the batch and is left for the next read, which raises then."""
        batch = [self.read()]
        lines = self._lines
        while lines:
            try:
                batch.append(decode_server(lines[0]))
            except ProtocolError:
                break
            lines.popleft()
        return batch

    def status(self, req: int = 1) -> StatusReply:
        """The host's whole state, asked for as ``req`` and read in however many lines it
        comes (a server too old to stream answers in one); ConnectionError on any other
        answer (an ``error`` names its reason)."""
        self.send_bytes(encode(Status(req, stream=True)))
        parts: list[StatusPart] = []
        while True:
            reply = self.read()
            if isinstance(reply, StatusPart) and reply.req == req:
                parts.append(reply)
            elif isinstance(reply, StatusReply) and reply.req == req:
                return join_status(parts, reply)
            elif isinstance(reply, ErrorReply):
                raise ConnectionError(
                    f"the hwpool server on {str(self.path)!r} did not answer status: "
                    f"{reply.message}"
                )
            else:
                raise ConnectionError(
                    f"unexpected reply to status from {str(self.path)!r}: {reply.op}"
                )

    def shutdown(self) -> None:
        """End the connection for both sides (wakes a thread blocked in ``read``)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
