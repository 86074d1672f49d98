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
import os
import socket
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

__all__ = ["UntrustedServerError", "Wire", "no_server_error"]

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
            raise ConnectionError(
                f"permission denied on {str(self.path)!r}: that server belongs to another user "
                "(start your own with `hwpool serve`, or ask its owner for --group)"
            ) from None
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
