"""The metrics port: a minimal HTTP/1.1 responder that runs in the server's own event loop.

Anyone on the machine can connect to a TCP port (there is no SO_PEERCRED to check and no
group to ask), so the port must cost the server nothing it cannot bound:

- **No thread per connection**: the listening socket is a reader of the server's loop and
  each connection a task of it; a connection waiting for bytes costs a descriptor and a few
  objects, never a thread.
- **A cap** (``max_connections``): a connection accepted while that many are open is closed
  at once, before anything is read, so the port never holds more descriptors than the cap
  and the queue's own socket always has the rest.
- **Timeouts** (``timeout_s``): the whole request must arrive within it, and the answer be
  taken within it again; a connection that does neither is dropped.
- **A size bound**: a request line and headers of at most :data:`MAX_REQUEST_BYTES`; a
  longer one is answered 431 and closed.

One request per connection (the answer says ``Connection: close``): a Prometheus scrape
needs no more. ``GET`` or ``HEAD`` of ``/metrics`` (or ``/``) is answered with what
``render`` gives; another path 404, another method 405, a malformed request 400.
Standard library only: the text itself comes from ``render`` (see ``_metrics``).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable

__all__ = ["MAX_REQUEST_BYTES", "MetricsListener", "listen"]

MAX_REQUEST_BYTES = 8192
"""The most a request line and its headers may take (Prometheus sends a few hundred)."""
ACCEPTS_PER_TURN = 64  # connections accepted per turn of the loop, so a flood cannot hog it
ACCEPT_RETRY_S = 1.0  # accept() out of descriptors: listen again after this long
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}  # fmt: skip
_PATHS = (b"/metrics", b"/")

Render = Callable[[], tuple[str, bytes]]
"""What the port serves: a content type and a body (called in the loop, once per scrape)."""


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking TCP socket listening on ``host``:``port`` (0: any free port), of the
    family ``host`` resolves to; OSError if it cannot be had."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def response(status: int, content_type: str, body: bytes, *, head_only: bool = False,
             extra: str = "") -> bytes:  # fmt: skip
    """One whole HTTP/1.1 answer that closes the connection."""
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


def _plain(status: int, text: str) -> bytes:
    extra = "Allow: GET, HEAD\r\n" if status == 405 else ""
    return response(status, "text/plain; charset=utf-8", f"{text}\n".encode(), extra=extra)


class MetricsListener:
    """The port: :meth:`start` it in the loop that serves it, :meth:`stop` it in that loop
    (or after the loop has closed)."""

    def __init__(self, sock: socket.socket, render: Render, max_connections: int,
                 timeout_s: float) -> None:  # fmt: skip
        self.sock = sock
        self.render = render
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.over_cap = 0  # connections closed at once, the cap being reached

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Accept connections in ``loop`` (the running one)."""
        self.loop = loop
        loop.add_reader(self.sock.fileno(), self._accept)

    def stop(self) -> None:
        """Stop listening and drop every connection (idempotent)."""
        loop, self.loop = self.loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self.sock.fileno())
            for task in list(self.tasks):
                task.cancel()
        self.sock.close()

    # ------------------------------------------------------------- accepting
    def _accept(self) -> None:
        """Take what connections wait (a bounded number this turn): each becomes a task
        while fewer than the cap are open, and is closed at once otherwise."""
        assert self.loop is not None
        for _ in range(ACCEPTS_PER_TURN):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno != errno.ECONNABORTED:
                    self._pause()  # out of descriptors: listening would spin
                    return
                continue
            if len(self.tasks) >= self.max_connections:
                self.over_cap += 1
                conn.close()
                continue
            conn.setblocking(False)
            task = self.loop.create_task(self._serve(conn))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _pause(self) -> None:
        """Stop accepting for ACCEPT_RETRY_S (accept() failed: descriptors or memory)."""
        loop = self.loop
        assert loop is not None
        loop.remove_reader(self.sock.fileno())

        def resume() -> None:
            if self.loop is loop and not loop.is_closed():
                loop.add_reader(self.sock.fileno(), self._accept)

        loop.call_later(ACCEPT_RETRY_S, resume)

    # ------------------------------------------------------------- one connection
    async def _serve(self, conn: socket.socket) -> None:
        """Read one request, answer it, close: each step bounded by ``timeout_s``."""
        try:
            reader, writer = await asyncio.open_connection(sock=conn, limit=MAX_REQUEST_BYTES)
        except OSError:
            conn.close()
            return
        transport = writer.transport
        try:
            answer = await self._answer(reader)
            if answer is not None:
                transport.set_write_buffer_limits(high=0)  # drain: until all is sent
                writer.write(answer)
                await asyncio.wait_for(writer.drain(), self.timeout_s)
                writer.close()  # nothing left to send: closes now
        except (OSError, TimeoutError):
            pass
        finally:
            if not transport.is_closing():
                transport.abort()

    async def _answer(self, reader: asyncio.StreamReader) -> bytes | None:
        """The answer to the request ``reader`` brings; None for no answer (the client
        closed, or sent no whole request within the timeout)."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
        except asyncio.LimitOverrunError:
            return _plain(431, f"a request is at most {MAX_REQUEST_BYTES} bytes")
        except (asyncio.IncompleteReadError, TimeoutError):
            return None
        return self._respond(head.split(b"\r\n", 1)[0])

    def _respond(self, request_line: bytes) -> bytes:
        """The answer to ``request_line`` (``GET /metrics HTTP/1.1``)."""
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return _plain(400, "not an HTTP request")
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _plain(405, "only GET and HEAD")
        if target not in _PATHS:
            return _plain(404, "the metrics are at /metrics")
        try:
            content_type, body = self.render()
        except Exception:  # a bug of ours: this scrape fails, the server goes on
            return _plain(500, "the metrics could not be rendered")
        return response(200, content_type, body, head_only=method == b"HEAD")
