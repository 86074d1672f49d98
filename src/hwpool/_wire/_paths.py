"""Where the host server's socket lives, for the server and its clients alike.

A server serves on ``--socket``, else ``HWPOOL_SOCKET``, else the per-user socket:
``$XDG_RUNTIME_DIR/hwpool/hwpool.sock``, else ``/tmp/hwpool-<uid>/hwpool.sock``.

A client (``socket=``, ``--socket``) looks in the same places, but before the per-user socket
it looks for the machine-wide server at ``/run/hwpool/hwpool.sock`` (``HWPOOL_SYSTEM_SOCKET``
names another place; set empty, none): when that socket or its lock file exists (a server
runs there, or is being restarted), clients use it, and no per-user server is started.

The lock file (``<socket>.lock``), the journal (``<socket>.journal``), the start lock
(``<socket>.start``, held by whoever starts a server or lets an idle one go) and the log of a
server started in the background (``<socket>.log``) sit beside the socket. Whether a path may
be trusted is ``_safety``'s to say.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MAX_SOCKET_PATH", "SOCKET_VAR", "SYSTEM_SOCKET", "SYSTEM_SOCKET_VAR", "ClientSocket",
    "client_socket", "lock_path", "log_path", "socket_path",
    "start_lock_path", "system_server", "system_socket",
]  # fmt: skip

SOCKET_VAR = "HWPOOL_SOCKET"
SYSTEM_SOCKET_VAR = "HWPOOL_SYSTEM_SOCKET"
SYSTEM_SOCKET = "/run/hwpool/hwpool.sock"
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


@dataclass(frozen=True, slots=True)
class ClientSocket:
    """The socket a client uses and why: ``source`` is ``socket`` (given), ``HWPOOL_SOCKET``,
    ``system`` (the machine-wide server), ``XDG_RUNTIME_DIR`` or ``default`` (per-user)."""

    path: Path
    source: str

    @property
    def per_user(self) -> bool:
        """Whether it is the per-user socket, the only one where a server is autostarted."""
        return self.source in ("XDG_RUNTIME_DIR", "default")


def client_socket(
    explicit: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    uid: int | None = None,
) -> ClientSocket:
    """The socket a client connects to (see the module); ValueError for a bad path."""
    env = os.environ if environ is None else environ
    if explicit is None and not env.get(SOCKET_VAR):
        system = system_server(env)
        if system is not None:
            return ClientSocket(system, "system")
    path = socket_path(explicit, env, uid)
    if explicit is not None:
        return ClientSocket(path, "socket")
    if env.get(SOCKET_VAR):
        return ClientSocket(path, SOCKET_VAR)
    return ClientSocket(path, "XDG_RUNTIME_DIR" if env.get("XDG_RUNTIME_DIR") else "default")


def system_socket(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the machine-wide server listens: ``HWPOOL_SYSTEM_SOCKET`` (empty: nowhere), else
    ``/run/hwpool/hwpool.sock``; ValueError for a relative or too long path."""
    env = os.environ if environ is None else environ
    raw = env.get(SYSTEM_SOCKET_VAR, SYSTEM_SOCKET)
    if not raw:
        return None
    if not os.path.isabs(raw):
        raise ValueError(f"{SYSTEM_SOCKET_VAR} must be an absolute path, got {raw!r}")
    return socket_path(raw, env)


def system_server(environ: Mapping[str, str] | None = None) -> Path | None:
    """The machine-wide server's socket if one runs there or is being restarted (its socket
    or its lock file exists), else None."""
    path = system_socket(environ)
    if path is None:
        return None
    for candidate in (path, lock_path(path)):
        try:
            os.lstat(candidate)
        except FileNotFoundError:
            continue
        except OSError:  # cannot look (a directory only its group may enter): it is there
            return path
        return path
    return None


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
