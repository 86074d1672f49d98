"""A socket that accepts connections and closes them at once: a server on its way, as clients
see it (the path answers, the hello does not). Tests count the attempts a client makes on it,
which proves that the client kept trying, with no sleep and no clock.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from types import TracebackType

from hostserver import BOUND


class NotAServer:
    """Listens on ``path`` (replacing a stale socket file there) until ``close()``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.attempts = 0
        self._changed = threading.Condition()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            conn.close()
            with self._changed:
                self.attempts += 1
                self._changed.notify_all()

    def wait_for(self, attempts: int) -> None:
        """Return once ``attempts`` connections were made here (bounded by BOUND)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.attempts >= attempts, BOUND):
                raise AssertionError(f"{self.attempts} attempts on {self.path}, not {attempts}")

    def close(self) -> None:
        """Stop answering and remove the socket file (a real server may bind it then)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(BOUND)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def __enter__(self) -> NotAServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
