"""Where the host server's socket lives, for the server and its clients alike.

``--socket`` (or ``socket=``), else ``HWPOOL_SOCKET``, else
``$XDG_RUNTIME_DIR/hwpool/hwpool.sock``, else ``/tmp/hwpool-<uid>/hwpool.sock``. The lock
file (``<socket>.lock``), the journal (``<socket>.journal``), the start lock
(``<socket>.start``, held by whoever starts a server or lets an idle one go) and the log of a
server started in the background (``<socket>.log``) sit beside the socket.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "MAX_SOCKET_PATH", "SOCKET_VAR", "default_socket", "lock_path", "log_path", "socket_path",
    "start_lock_path",
]  # fmt: skip

SOCKET_VAR = "HWPOOL_SOCKET"
MAX_SOCKET_PATH = 107  # bytes: sun_path holds 108 with its terminating NUL


def socket_path(
    explicit: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    uid: int | None = None,
) -> Path:
    """The socket to serve on or connect to; ValueError for an empty or too long path."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        path, source = Path(explicit), "socket"
    elif env.get(SOCKET_VAR):
        path, source = Path(env[SOCKET_VAR]), SOCKET_VAR
    elif env.get("XDG_RUNTIME_DIR"):
        path, source = Path(env["XDG_RUNTIME_DIR"]) / "hwpool" / "hwpool.sock", "XDG_RUNTIME_DIR"
    else:
        user = os.getuid() if uid is None else uid
        path, source = Path(f"/tmp/hwpool-{user}") / "hwpool.sock", "default"
    if str(path) in ("", "."):
        raise ValueError(f"{source}: the socket path must not be empty")
    size = len(os.fsencode(path.absolute()))
    if size > MAX_SOCKET_PATH:
        raise ValueError(
            f"{source}: socket path {str(path)!r} is {size} bytes long; a Unix socket path "
            f"holds at most {MAX_SOCKET_PATH}"
        )
    return path.absolute()


def lock_path(socket: Path) -> Path:
    """The lock file that one server holds for ``socket`` as long as it runs."""
    return socket.with_name(socket.name + ".lock")


def start_lock_path(socket: Path) -> Path:
    """The lock a client holds while it starts a server for ``socket`` and connects to it, and
    an idle server holds while it stops listening: so a new client never meets a server on
    its way out, and two clients never start two servers."""
    return socket.with_name(socket.name + ".start")


def log_path(socket: Path) -> Path:
    """Where a server started in the background for ``socket`` writes its log."""
    return socket.with_name(socket.name + ".log")


def default_socket(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> bool:
    """Whether the socket is the per-user default (neither given nor set in ``HWPOOL_SOCKET``)."""
    return explicit is None and not environ.get(SOCKET_VAR)
