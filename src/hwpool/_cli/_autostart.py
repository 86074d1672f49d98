"""Connect to the host server, starting one for this user first when none answers (as tmux does).

Only on the per-user default socket (neither ``--socket`` nor ``HWPOOL_SOCKET``: a socket named
there is someone's service to start), never while a machine-wide server exists (it shares out
the same GPUs: see ``_wire._paths.system_server``), never past a server that failed the
client's checks (``UntrustedServerError``), and unless ``HWPOOL_AUTOSTART=0`` or
``--no-start``. The start lock and the log are opened as side files (``_wire._safety``).
The server is started detached (its own session, stdin from /dev/null), logs to
``<socket>.log`` and stops after ``IDLE_TIMEOUT_S`` with no client. Starting and connecting
happen under ``<socket>.start`` (``flock``), which an idle server also takes before it stops
listening: two clients never start two servers, and none connects to a server on its way out.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .._backends._unix import UnixBackend
from .._server._listen import ServeError, prepare_directory
from .._wire._paths import SYSTEM_SOCKET_VAR, log_path, start_lock_path, system_server
from .._wire._safety import UnsafePathError, UntrustedServerError, open_side_file

__all__ = ["IDLE_TIMEOUT_S", "connect"]

IDLE_TIMEOUT_S = 600.0
START_TIMEOUT_S = 20.0  # how long a server that was started may take to answer


def connect(
    path: Path, *, autostart: bool, name: str | None, command: str | None, memory: bool = False,
    reconnect_timeout: float | None = None, connect_timeout: float = 10.0,
) -> UnixBackend:  # fmt: skip
    """A client of the server on ``path``; with ``autostart``, start one if none answers
    (``memory``: one sized in memory, ``hwpool serve --memory``). ``reconnect_timeout`` and
    ``connect_timeout``: the client's (see ``UnixBackend``).

    Raises ConnectionError when none answers (and none could be started).
    """
    client = functools.partial(
        UnixBackend, path, name=name, command=command, reconnect_timeout=reconnect_timeout,
        connect_timeout=connect_timeout,
    )  # fmt: skip
    try:
        return client()
    except UntrustedServerError:
        raise
    except ConnectionError:
        if not autostart:
            raise
    _no_system_server(path)
    try:
        prepare_directory(path.parent, None)
    except ServeError as exc:
        raise ConnectionError(f"cannot start a server on {str(path)!r}: {exc}") from None
    with _locked(start_lock_path(path)):
        try:  # another client may have started one while this one waited for the lock
            return client()
        except UntrustedServerError:
            raise
        except ConnectionError:
            pass
        server = _start_server(path, memory)
        return _connect_started(path, server, client)


def _no_system_server(path: Path) -> None:
    """ConnectionError if a machine-wide server appeared since the socket was chosen: a
    per-user server would share out its GPUs a second time."""
    system = system_server()
    if system is not None:
        raise ConnectionError(
            f"a machine-wide hwpool server is on {str(system)!r}: not starting a per-user one "
            f"on {str(path)!r} (it would share out the same GPUs again); use that server, or "
            f"set {SYSTEM_SOCKET_VAR} to another place"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        fd = open_side_file(path, os.O_RDWR | os.O_CREAT, what="start lock")
    except UnsafePathError as exc:
        raise ConnectionError(f"cannot start a server: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_started: list[subprocess.Popen[bytes]] = []  # kept, so that nothing warns about them


def _start_server(path: Path, memory: bool) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "hwpool", "serve", "--socket", str(path)]
    argv += ["--idle-timeout", f"{IDLE_TIMEOUT_S:g}", *(["--memory"] if memory else [])]
    try:
        log = open_side_file(log_path(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, what="log")
    except UnsafePathError as exc:
        raise ConnectionError(f"cannot start a server: {exc}") from None
    try:
        server = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            cwd="/",
        )  # fmt: skip
    finally:
        os.close(log)
    _started.append(server)
    return server


def _connect_started(
    path: Path, server: subprocess.Popen[bytes], client: Callable[[], UnixBackend]
) -> UnixBackend:
    """Connect (``client()``) to the server just started, retrying (with backoff) until it
    answers."""
    deadline = time.monotonic() + START_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            return client()
        except UntrustedServerError:
            raise
        except ConnectionError as exc:
            code = server.poll()
            if code is not None:
                raise ConnectionError(
                    f"the hwpool server started on {str(path)!r} exited {code}: see "
                    f"{str(log_path(path))!r}"
                ) from None
            if time.monotonic() + delay > deadline:
                raise ConnectionError(
                    f"the hwpool server started on {str(path)!r} did not answer within "
                    f"{START_TIMEOUT_S:g} s ({exc}); see {str(log_path(path))!r}"
                ) from None
        time.sleep(delay)  # bounded backoff while the new server starts
        delay = min(2 * delay, 0.1)
