"""A decoy hwpool deployment: sockets where a deployed server would be, that count who comes.

Each decoy socket relays to a real ``hwpool serve`` (on a private socket of its own), so a
client that wrongly reaches one gets real answers (and takes a real lease, as the suite used
to on a deployed box), and the decoy counts the connection. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from types import TracebackType

from hostserver import BOUND


class Relay:
    """Listens on ``path`` (made 0666: any user may try it), counts each connection and
    relays it to the server on ``target`` until ``close()``."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path, self.target = path, target
        self.connections = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o666)
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            with self._lock:
                self.connections += 1
                self._open.append(conn)
            try:
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                upstream.settimeout(BOUND)
                upstream.connect(str(self.target))
                upstream.settimeout(None)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._open.append(upstream)
            for source, sink in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        """Stop listening, end every relayed connection, remove the socket file."""
        self._sock.close()
        self._thread.join(BOUND)
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> Relay:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either end closes."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
