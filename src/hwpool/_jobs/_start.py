"""Making sure the user's supervisor runs: wake it, or start it, detached from the terminal.

``hwpool submit`` (and ``cancel``, ``retry``) first write the table, then call
:func:`ensure_supervisor`: a supervisor that runs is woken through ``supervisor.sock`` (so
that it looks at the table at once rather than within half a second); when none answers,
one is started in a session of its own (``setsid``: no controlling terminal, so no SIGHUP
when the terminal closes), with stdin from ``/dev/null`` and its output appended to
``supervisor.log``. A supervisor that finds another holding ``supervisor.lock`` waits for
it to exit (one that is exiting for idleness) or, after a while, leaves it the work. A
supervisor is started for one server, the one the starting shell chose (see ``_servers``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from .._wire._paths import ClientSocket, client_socket
from .._wire._safety import open_side_file
from ._state import LOG_NAME, SOCKET_NAME, prepare_state_directory

__all__ = ["ensure_supervisor", "logout_warning", "wake_supervisor"]

WAKE_TIMEOUT_S = 2.0
_ENTRY = "from hwpool._cli._supervise import main; raise SystemExit(main())"


def wake_supervisor(directory: Path) -> bool:
    """Wake the supervisor of ``directory``; whether one answered."""
    path = directory / SOCKET_NAME
    if len(os.fsencode(path)) >= 108:  # longer than sun_path: reach it through its folder
        return _wake_via_folder(directory)
    return _wake(str(path))


def _wake_via_folder(directory: Path) -> bool:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return _wake(f"/proc/self/fd/{fd}/{SOCKET_NAME}")
    finally:
        os.close(fd)


def _wake(address: str) -> bool:
    """Connect to the supervisor's socket: whether one listens there. Nothing is awaited
    from it: a connection accepted by the kernel is a wake the supervisor sees when it next
    turns (waiting for its answer would make every submit wait for its turn)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WAKE_TIMEOUT_S)
        try:
            sock.connect(address)
        except OSError:
            return False
        with contextlib.suppress(OSError):
            sock.sendall(b"wake\n")
        return True


def ensure_supervisor(directory: Path, server: ClientSocket | None = None) -> None:
    """Wake the supervisor of state directory ``directory``, or start one for ``server``
    (default: the server this process would use, ``client_socket()``)."""
    prepare_state_directory(directory)
    if wake_supervisor(directory):
        return
    where = _server_args(server)
    log = open_side_file(
        directory / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, what="supervisor log"
    )
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(directory), *where],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            cwd="/", close_fds=True,
        )  # fmt: skip
    finally:
        with contextlib.suppress(OSError):
            os.close(log)
    process.wait()  # it forks at once and exits: the supervisor is nobody's child here


def _server_args(server: ClientSocket | None) -> list[str]:
    """The supervisor's ``SOCKET SOURCE`` for ``server`` (default: ``client_socket()``);
    none when the environment names no usable socket (the supervisor then says why in its
    log, and the caller, a retry, is not failed for it)."""
    if server is None:
        try:
            server = client_socket()
        except ValueError:
            return []
    return [str(server.path), server.source]


def logout_warning(user: str, root: Path = Path("/")) -> str | None:
    """What to tell ``user`` when systemd-logind ends a user's processes at logout
    (``KillUserProcesses=yes`` in ``logind.conf`` or a drop-in of ``logind.conf.d``) and the
    user has no lingering (``loginctl enable-linger``): their jobs would end when they log
    out. None when nothing says so (the default of systemd is ``no``)."""
    if (root / "var/lib/systemd/linger" / user).exists():
        return None
    etc = root / "etc/systemd"
    files = [etc / "logind.conf", *sorted((etc / "logind.conf.d").glob("*.conf"))]
    kills = False
    for path in files:  # later files override earlier ones, as logind reads them
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for line in path.read_text().splitlines():
                key, _, value = line.strip().partition("=")
                if key.strip() == "KillUserProcesses":
                    kills = value.strip().lower() in ("yes", "true", "1", "on")
    if not kills:
        return None
    return (
        "systemd-logind ends your processes when you log out (KillUserProcesses=yes): run "
        "`loginctl enable-linger` once, or your jobs end with your session"
    )
