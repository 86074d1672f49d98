"""The server's side of the socket: its directory and modes, the one-server lock, peer identity.

- The directory is created with mode 0700 (only this user), or 0750 and group ``--group``
  for a machine-wide server: group members may reach the socket, not write the directory
  (they could rename the socket and bind their own, or plant side files). An existing
  directory is used as it is, provided it passes ``_wire._safety.check_directory``: it
  belongs to this user or root, and neither its group nor others may write it (a socket
  directly in a shared directory such as ``/tmp`` is refused).
- The socket file gets mode 0600 (0660 and the group): on Linux, connecting needs write
  permission on it, so the kernel refuses other users before the server sees them.
- ``<socket>.lock`` is held (``flock``) for as long as the server runs: a second server on the
  same path fails at once, and a socket file left by a dead server is known to be stale. It
  is opened as every side file is (``_wire._safety.open_side_file``: no symbolic link, no
  FIFO, a regular file of this uid).
- Identity comes from the kernel (``SO_PEERCRED``), never from what a client says.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import socket
import stat
from pathlib import Path

from .._wire._paths import lock_path
from .._wire._safety import Peer, UnsafePathError, check_directory, open_side_file, peer_of

__all__ = [
    "Peer", "ServeError", "admitted", "bind", "hold_lock", "peer_of", "prepare_directory",
    "refusal",
]  # fmt: skip

BACKLOG = 512


class ServeError(Exception):
    """The server cannot start (reported in one line; exit status 2)."""


def prepare_directory(directory: Path, group: int | None) -> None:
    """Create ``directory`` (0700, or 0750 owned by ``group``) or check the existing one;
    ServeError saying what is wrong and what to do when it is not safe to serve from."""
    try:
        directory.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ServeError(f"cannot create {str(directory)!r}: {exc.strerror}") from None
    else:
        if group is not None:
            os.chown(directory, -1, group)
        os.chmod(directory, 0o700 if group is None else 0o750)
    try:
        check_directory(directory, {os.geteuid(), 0})
    except UnsafePathError as exc:
        raise ServeError(str(exc)) from None
    except OSError as exc:
        raise ServeError(f"cannot check {str(directory)!r}: {exc.strerror}") from None


def hold_lock(socket_path: Path) -> int:
    """Take the lock of ``socket_path`` for this process; ServeError if a server holds it.

    Returns the lock's file descriptor, to keep open until exit (the kernel drops the lock
    when the process dies, however it dies). The file is never removed: a server waiting on
    a removed file would hold a lock nobody else sees.
    """
    path = lock_path(socket_path)
    try:
        fd = open_side_file(path, os.O_RDWR | os.O_CREAT, what="lock file")
    except UnsafePathError as exc:
        raise ServeError(str(exc)) from None
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


def refusal(uid: int, server_uid: int, group: int | None) -> str:
    """Why ``uid`` is refused by a server run by ``server_uid`` for ``group``: the group it
    serves, by name, and whom to ask. It says "may not use this server" (the client knows a
    refusal of this user by it) and suggests no server of one's own: on a shared machine
    that would share out the same GPUs a second time."""
    if group is None:
        return (
            f"uid {uid} may not use this server (it serves uid {server_uid} only): ask its "
            "admin to serve a group of yours (hwpool serve --group)"
        )
    try:
        name = repr(grp.getgrgid(group).gr_name)
    except KeyError:
        name = f"gid {group}"
    return (
        f"uid {uid} may not use this server (it serves uid {server_uid} and the members of "
        f"group {name}): ask its admin to add you to group {name} (then log in again)"
    )


def _groups_of(pid: int) -> set[int]:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    return set()
