"""The rules for every path the host server or a client trusts, in one place.

Paths are an attack surface: on a shared machine another user may create a directory first,
plant a symbolic link or a FIFO where a side file will be opened, or serve a socket of their
own where a client looks for the real server. The rules, checked the way OpenSSH checks the
paths of ``authorized_keys``:

- **The socket's directory** is a real directory (not a symbolic link) that neither its group
  nor others may write (not even with the sticky bit: a socket directly in ``/tmp`` is
  refused). Every directory above it is owned by root or by a trusted uid, and no one else
  may write it unless it is sticky (like ``/tmp``); a directory that sits directly in such a
  writable directory must belong to the user or root, since anyone could have made it first.
- **Side files** (lock, start lock, log, journal and its temporary file) are opened with
  ``O_NOFOLLOW`` (``O_EXCL`` where they are created) and without blocking (a FIFO cannot
  stall the opener), then checked by ``fstat``: a regular file, owned by the server's uid,
  not writable by group or others, with one link. Anything else is refused, never repaired.
- **A client verifies the server before it sends anything**, the hello included: the
  socket's directory passes the rules above, and the process listening on the socket
  (``SO_PEERCRED``, from the kernel) runs as the user, as root, or as the owner of the
  socket's directory (for a machine-wide server run by a service account).

Errors say which path, what is wrong with it and what to do: :class:`UnsafePathError` on the
server's side (an ``OSError``), :class:`UntrustedServerError` on a client's (a
``ConnectionError``, so that callers report it as they report an absent server).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import pwd
import socket
import stat
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = [
    "Peer", "UnsafePathError", "UntrustedServerError", "check_directory", "create_side_file",
    "open_side_file", "peer_of", "read_trusted_file", "server_uids", "verify_peer",
]  # fmt: skip

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_SIDE_FILE_TRIES = 5  # a name that keeps changing between open and create is refused


class UnsafePathError(OSError):
    """A path the server will not trust: the message says which, what is wrong, what to do."""


class UntrustedServerError(ConnectionError):
    """A client refused a server before sending it anything: the message says why."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A connected process as the kernel reports it."""

    pid: int
    uid: int
    gid: int


class _HasSockOpt(Protocol):
    def getsockopt(self, level: int, option: int, size: int, /) -> bytes: ...


def peer_of(sock: _HasSockOpt) -> Peer:
    """The pid, uid and gid of the process at the other end of ``sock`` (SO_PEERCRED): for a
    client, the server that called ``listen``; for the server, the client that connected."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def user_name(uid: int) -> str:
    """``uid 1001 (alice)``, or ``uid 1001`` when it has no name."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


# ----------------------------------------------------------------- directories
def check_directory(
    directory: Path, owners: Collection[int], *, what: str = "socket"
) -> os.stat_result:
    """Check the ``directory`` of the socket (or of the ``what``, say a config file) and every
    directory above it; its ``lstat``.

    ``directory`` must be a real directory owned by a uid in ``owners``, not writable by
    group or others; above it, each directory is owned by root or a uid in ``owners`` and
    writable by no one else unless sticky; one in a sticky writable directory (which anyone
    could have made first) belongs to this process's uid or root. Raises UnsafePathError
    saying what is wrong and what to do, FileNotFoundError when ``directory`` is missing.
    """
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(
            f"{str(directory)!r} is a symbolic link: the {what}'s directory must be a real "
            "directory (remove the link, or choose the directory itself)"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(f"{str(directory)!r} exists and is not a directory")
    _check_ancestors(Path(os.path.realpath(directory)), owners, what)
    if info.st_uid not in owners:
        allowed = " or ".join(user_name(uid) for uid in sorted(owners))
        raise UnsafePathError(
            f"{str(directory)!r} belongs to {user_name(info.st_uid)}, not to {allowed}: "
            f"refusing to use a {what} there (remove it if it is not yours, or choose another "
            "path)"
        )
    if info.st_mode & _WRITABLE_BY_OTHERS:
        raise UnsafePathError(_writable_message(directory, info, what))
    return info


def _writable_message(directory: Path, info: os.stat_result, what: str) -> str:
    who = "everyone" if info.st_mode & stat.S_IWOTH else "its group"
    if what != "socket":
        return (
            f"{str(directory)!r} is writable by {who}: they could replace the {what} in it; "
            f"remove that write permission (chmod go-w {str(directory)!r}) or move the {what}"
        )
    if info.st_mode & stat.S_ISVTX:
        return (
            f"{str(directory)!r} is a shared directory (writable by {who}, sticky): another "
            "user could plant the server's socket or side files (lock, journal, log) there; "
            f"put the socket in a directory of its own, such as {str(directory / 'hwpool')!r} "
            "(hwpool serve creates it, mode 0700)"
        )
    return (
        f"{str(directory)!r} is writable by {who}: they could replace the socket or its side "
        f"files; remove that write permission (chmod go-w {str(directory)!r}; group members "
        "only need to reach the socket: mode 0750) or choose another directory"
    )


def _check_ancestors(real: Path, owners: Collection[int], what: str) -> None:
    """Every directory above ``real`` (a resolved path): see :func:`check_directory`."""
    trusted = {0, *owners}
    first_come = {0, os.geteuid()}  # who may own what anyone could have created first
    chain = [*reversed(real.parents), real]
    for parent, child in itertools.pairwise(chain):
        above = os.lstat(parent)
        if above.st_uid not in trusted:
            raise UnsafePathError(
                f"{str(parent)!r} (above the {what}) belongs to {user_name(above.st_uid)}, who "
                f"could replace {str(child)!r}: choose a path owned by you or root"
            )
        writable = above.st_mode & _WRITABLE_BY_OTHERS
        if writable and not above.st_mode & stat.S_ISVTX:
            raise UnsafePathError(
                f"{str(parent)!r} (above the {what}) is writable by others without the "
                f"sticky bit: anyone could replace {str(child)!r}; choose another path"
            )
        below = os.lstat(child)
        if writable and below.st_uid not in first_come:
            raise UnsafePathError(
                f"{str(child)!r} belongs to {user_name(below.st_uid)} and sits in "
                f"{str(parent)!r}, where anyone can create entries: another user may have "
                "made it first to impersonate the server; remove it (or have an admin remove "
                "it) or choose a directory of your own"
            )


# ----------------------------------------------------------------- a client's checks
def server_uids(socket_path: Path) -> frozenset[int]:
    """Before connecting: the uids a server on ``socket_path`` may run as, once the path
    passed the rules (the user, root and the owner of the socket's directory).

    The socket's directory may belong to the user, root, or anyone who was given it by a
    directory nobody else can write (``/run/hwpool`` made by root for a service account).
    Raises UntrustedServerError for an unsafe path, FileNotFoundError when it is missing.
    """
    me = os.geteuid()
    directory = socket_path.parent
    try:
        info = os.lstat(directory)
        owner = info.st_uid if stat.S_ISDIR(info.st_mode) else me
        check_directory(directory, {me, 0, owner})
        found = os.lstat(socket_path)
    except UnsafePathError as exc:
        raise UntrustedServerError(_refusal(socket_path, str(exc))) from None
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISSOCK(found.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not a socket"
        raise UntrustedServerError(
            _refusal(socket_path, f"{str(socket_path)!r} is {kind}; remove it if it is yours")
        )
    return frozenset({me, 0, owner})


def verify_peer(sock: _HasSockOpt, socket_path: Path, allowed: Collection[int]) -> Peer:
    """After connecting, before sending: the server's process, if it runs as a uid in
    ``allowed`` (see :func:`server_uids`); UntrustedServerError otherwise."""
    peer = peer_of(sock)
    if peer.uid not in allowed:
        names = ", ".join(user_name(uid) for uid in sorted(allowed))
        raise UntrustedServerError(
            _refusal(
                socket_path,
                f"the process serving it (pid {peer.pid}) runs as {user_name(peer.uid)}, not "
                f"as one of {names}: someone else may be impersonating the server",
            )
        )
    return peer


def _refusal(socket_path: Path, why: str) -> str:
    return f"refusing the hwpool server on {str(socket_path)!r}, nothing was sent to it: {why}"


# ----------------------------------------------------------------- side files
def open_side_file(
    path: Path, flags: int, *, owner: int | None = None, mode: int = 0o600, what: str = "file"
) -> int:
    """Open a side file of the server (lock, start lock, log, journal) without trusting it.

    ``flags`` as for ``os.open``; ``O_CREAT`` creates a missing file (with ``O_EXCL``, so a
    file that appears meanwhile is opened and checked rather than trusted); ``O_TRUNC``
    truncates only after the checks. Never follows a symbolic link, never blocks on a FIFO.
    The file must be a regular file owned by ``owner`` (default: this process's uid), not
    writable by group or others, with one link. Returns the descriptor (close-on-exec);
    UnsafePathError naming ``what``, the path and what to do otherwise.

    Every side file must be opened through this or :func:`create_side_file` (the journal
    too: it lives in a directory the server does not solely control).
    """
    expected = os.geteuid() if owner is None else owner
    plain = flags & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC)
    plain |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    for _ in range(_SIDE_FILE_TRIES):
        try:
            fd = os.open(path, plain)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
            try:
                fd = os.open(path, plain | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                continue  # made by someone else meanwhile: open that one and check it
        except OSError as exc:
            raise _open_error(path, exc, what) from None
        return _checked(fd, path, expected, what, truncate=bool(flags & os.O_TRUNC))
    raise UnsafePathError(f"the {what} {str(path)!r} keeps changing: refusing to open it")


def create_side_file(
    path: Path, flags: int, *, owner: int | None = None, mode: int = 0o600, what: str = "file"
) -> int:
    """Create ``path`` afresh (``O_CREAT|O_EXCL|O_NOFOLLOW``), first removing whatever has
    that name (a stale temporary file, or something planted there): for a temporary file
    that is written and then renamed over the real one. Checked as in
    :func:`open_side_file`."""
    expected = os.geteuid() if owner is None else owner
    create = flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    for _ in range(_SIDE_FILE_TRIES):
        try:
            fd = os.open(path, create, mode)
        except FileExistsError:
            path.unlink(missing_ok=True)  # removes the name only: never what a link points to
            continue
        except OSError as exc:
            raise _open_error(path, exc, what) from None
        return _checked(fd, path, expected, what, truncate=False)
    raise UnsafePathError(f"the {what} {str(path)!r} keeps reappearing: refusing to create it")


def _open_error(path: Path, exc: OSError, what: str) -> OSError:
    if exc.errno == errno.ELOOP:
        return _unsafe(path, what, "is a symbolic link (never followed: it could make the "
                       "server write another file)")  # fmt: skip
    if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
        return _unsafe(path, what, "is not a regular file (a FIFO)")
    return exc


def _unsafe(path: Path, what: str, problem: str) -> UnsafePathError:
    return UnsafePathError(
        f"the {what} {str(path)!r} {problem}: refusing to use it (remove it; someone else may "
        "have planted it)"
    )


def _checked(fd: int, path: Path, owner: int, what: str, *, truncate: bool) -> int:
    """``fd`` if what it opened is safe to use (then blocking again), else closed + raise."""
    try:
        info = os.fstat(fd)
        problem = _side_file_problem(info, owner)
        if problem is not None:
            raise _unsafe(path, what, problem)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _side_file_problem(info: os.stat_result, owner: int) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != owner:
        return f"belongs to {user_name(info.st_uid)}, not to the server's {user_name(owner)}"
    if info.st_mode & _WRITABLE_BY_OTHERS:
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    if info.st_nlink != 1:
        return f"has {info.st_nlink} hard links (another name could reach it)"
    return None


# ----------------------------------------------------------------- the config file
MAX_CONFIG_BYTES = 1 << 20
"""The most a server's config file may hold (a bound: a config is a few lines)."""


def read_trusted_file(path: Path, owners: Collection[int], what: str = "config file") -> bytes:
    """The contents of ``path``, a file the server takes orders from (its config), checked as
    a side file is (:func:`open_side_file`: never through a symbolic link, never blocking on a
    FIFO, a regular file not writable by group or others) except that it may belong to any
    uid in ``owners`` (root or the server's own) and have other links (whoever can write it
    under another name is its owner). UnsafePathError naming ``what``, the path and the
    problem; FileNotFoundError when it is missing."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _open_error(path, exc, what) from None
    try:
        problem = _trusted_file_problem(os.fstat(fd), owners)
        if problem is not None:
            raise UnsafePathError(
                f"the {what} {str(path)!r} {problem}: refusing to read it (it must belong to "
                "root or the server's user and be writable by its owner only: chown root and "
                f"chmod go-w {str(path)!r})"
            )
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise UnsafePathError(f"the {what} {str(path)!r} is over {MAX_CONFIG_BYTES} bytes")
    return data


def _trusted_file_problem(info: os.stat_result, owners: Collection[int]) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid not in owners:
        allowed = " or ".join(user_name(uid) for uid in sorted(set(owners)))
        return f"belongs to {user_name(info.st_uid)}, not to {allowed}"
    if info.st_mode & _WRITABLE_BY_OTHERS:
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None
