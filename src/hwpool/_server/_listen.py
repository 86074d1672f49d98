"""The server's side of the socket: its directory and modes, the one-server lock, peer identity.

- The directory is created with mode 0700 (only this user), or 0770 and group ``--group``
  for a machine-wide server. An existing directory is used as it is, provided it belongs to
  this user or root and others cannot write to it (unless it is sticky, like ``/tmp``).
- The socket file gets mode 0600 (0660 and the group): on Linux, connecting needs write
  permission on it, so the kernel refuses other users before the server sees them.
- ``<socket>.lock`` is held (``flock``) for as long as the server runs: a second server on the
  same path fails at once, and a socket file left by a dead server is known to be stale.
- Identity comes from the kernel (``SO_PEERCRED``), never from what a client says.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .._wire._paths import lock_path

__all__ = ["Peer", "ServeError", "admitted", "bind", "hold_lock", "peer_of", "prepare_directory"]

BACKLOG = 512


class ServeError(Exception):
    """The server cannot start (reported in one line; exit status 2)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A connected process as the kernel reports it."""

    pid: int
    uid: int
    gid: int


def prepare_directory(directory: Path, group: int | None) -> None:
    """Create ``directory`` (0700, or 0770 owned by ``group``) or check the existing one."""
    try:
        directory.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        _check_existing(directory)
        return
    except OSError as exc:
        raise ServeError(f"cannot create {str(directory)!r}: {exc.strerror}") from None
    if group is not None:
        os.chown(directory, -1, group)
    os.chmod(directory, 0o700 if group is None else 0o770)


def _check_existing(directory: Path) -> None:
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise ServeError(f"{str(directory)!r} exists and is not a directory")
    if info.st_uid not in (os.getuid(), 0):
        raise ServeError(
            f"{str(directory)!r} belongs to uid {info.st_uid}, not to you: refusing to put a "
            "socket there (remove it, or choose another path with --socket)"
        )
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise ServeError(f"{str(directory)!r} is writable by everyone: choose another directory")


def hold_lock(socket_path: Path) -> int:
    """Take the lock of ``socket_path`` for this process; ServeError if a server holds it.

    Returns the lock's file descriptor, to keep open until exit (the kernel drops the lock
    when the process dies, however it dies). The file is never removed: a server waiting on
    a removed file would hold a lock nobody else sees.
    """
    path = lock_path(socket_path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ServeError(f"cannot open the lock file {str(path)!r}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ServeError(
                f"a server is already running on {str(socket_path)!r} (pid {holder}); "
                "stop it first, or serve on another path with --socket"
            ) from None
        raise ServeError(f"cannot lock {str(path)!r}: {exc.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def bind(path: Path, group: int | None) -> socket.socket:
    """Listen on ``path``, replacing a stale socket file; the lock must be held already."""
    _remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mode = 0o600 if group is None else 0o660
    old_umask = os.umask(0o777 & ~mode)  # never reachable by others, not even for an instant
    try:
        sock.bind(os.fspath(path))
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {str(path)!r}: {exc.strerror}") from None
    finally:
        os.umask(old_umask)
    if group is not None:
        os.chown(path, -1, group)
    os.chmod(path, mode)
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def _remove_stale(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ServeError(f"{str(path)!r} exists and is not a socket: remove it or use --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(os.fspath(path))
    except OSError:
        path.unlink(missing_ok=True)  # nobody answers: left by a dead server
        return
    finally:
        probe.close()
    raise ServeError(f"a server without the lock is answering on {str(path)!r}")


class _HasSockOpt(Protocol):
    def getsockopt(self, level: int, option: int, size: int, /) -> bytes: ...


def peer_of(sock: _HasSockOpt) -> Peer:
    """The pid, uid and gid of the process at the other end of ``sock`` (SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def admitted(peer: Peer, server_uid: int, group: int | None) -> bool:
    """Whether ``peer`` may use a server run by ``server_uid`` for ``group`` (None: no group).

    Root and the server's own uid always may; with a group, so may its members (their
    primary gid, or the supplementary groups of their process).
    """
    if peer.uid in (0, server_uid):
        return True
    if group is None:
        return False
    return peer.gid == group or group in _groups_of(peer.pid)


def _groups_of(pid: int) -> set[int]:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    return set()
