"""The supervisor process's entry (``hwpool._jobs._start`` starts it): detach, take the lock,
prune the history, and supervise until idle (see ``hwpool._jobs._supervisor``).

It connects to the server it was started for (``SOCKET``, chosen by the shell that started
it: see ``hwpool._jobs._servers``), and says which in its lock file; on the per-user socket it
starts a server if none runs, as ``hwpool run`` does (unless ``HWPOOL_AUTOSTART=0`` in the
environment it was started in).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from .._backends._unix import UnixBackend
from .._jobs._model import JobRecord
from .._jobs._notify import notify_timeout_from_env
from .._jobs._servers import lock_text
from .._jobs._state import keep_from_env, prepare_state_directory
from .._jobs._store import JobStore
from .._jobs._supervisor import LOCK_NAME, Supervisor
from .._wire._paths import ClientSocket, client_socket
from .._wire._safety import UnsafePathError, open_side_file
from . import _autostart, _env

__all__ = ["LAUNCHER", "main"]

LOCK_WAIT_S = 10.0  # how long a new supervisor waits for one that is exiting
LAUNCHER = [sys.executable, "-c", "from hwpool._cli._launch import main; raise SystemExit(main())"]


def main(argv: Sequence[str] | None = None) -> int:
    """``DIR [SOCKET SOURCE]``: supervise the jobs of state directory DIR on the server of
    SOCKET (``ClientSocket.source`` says why it was chosen; default: ``client_socket()``);
    forks first (see ``_start``)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) not in (1, 3) or not all(os.path.isabs(path) for path in args[:2]):
        print(f"hwpool supervisor: give DIR [SOCKET SOURCE], absolute paths, got {args}")
        return 2
    try:
        server = client_socket() if len(args) == 1 else ClientSocket(Path(args[1]), args[2])
    except ValueError as exc:  # a bad HWPOOL_SOCKET, say
        print(f"hwpool supervisor: {exc}")
        return 2
    if os.fork():  # the starter waits for this process only, not for the supervisor
        os._exit(0)
    directory = Path(args[0])
    try:
        prepare_state_directory(directory)
        with _locked(directory / LOCK_NAME, server.path) as mine:
            if not mine:
                return 0
            return _supervise(directory, server)
    except UnsafePathError as exc:
        _log(f"cannot supervise: {exc}")
        return 1


@contextlib.contextmanager
def _locked(path: Path, socket: Path) -> Iterator[bool]:
    """Hold ``supervisor.lock``, saying in it this process's pid and the ``socket`` it
    serves: whether it was had within LOCK_WAIT_S (another supervisor holds it meanwhile:
    it runs, or it is exiting and this one takes over)."""
    fd = open_side_file(path, os.O_RDWR | os.O_CREAT, what="supervisor lock")
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)  # flock has no timeout; the one that holds it is exiting
        os.ftruncate(fd, 0)
        os.write(fd, lock_text(os.getpid(), socket))
        yield True
    finally:
        os.close(fd)


def _supervise(directory: Path, server: ClientSocket) -> int:
    keep_seconds, keep_count = keep_from_env(os.environ)
    notify_timeout = notify_timeout_from_env(os.environ)
    with JobStore.open(directory) as store:
        _prune(store, directory, keep_seconds, keep_count)
        _log(f"supervising the jobs of {str(directory)!r} on the server at "
             f"{str(server.path)!r} (pid {os.getpid()})")  # fmt: skip
        supervisor = Supervisor(
            store, directory, lambda memory: _connect(server, memory), LAUNCHER, log=_log,
            prune=lambda: _prune(store, directory, keep_seconds, keep_count),
            notify_timeout=notify_timeout,
        )  # fmt: skip
        asyncio.run(supervisor.run())
    return 0


def _connect(chosen: ClientSocket, memory: bool) -> UnixBackend:
    autostart = _env.autostart_from_env(os.environ) and chosen.per_user
    user = os.environ.get("USER") or str(os.getuid())
    return _autostart.connect(
        chosen.path, autostart=autostart, name="hwpool jobs", command=f"supervisor of {user}",
        memory=memory,
    )  # fmt: skip


def _prune(store: JobStore, directory: Path, keep_seconds: float, keep_count: int) -> None:
    """Forget the finished jobs past the retention, and remove their logs."""
    for job in store.prune(time.time(), keep_seconds, keep_count):
        _remove_logs(directory, job)


def _remove_logs(directory: Path, job: JobRecord) -> None:
    logs = directory / "logs"
    for name in (job.stdout_log, job.stderr_log):
        if name is not None and Path(name).parent == logs:  # only files of our own folder
            with contextlib.suppress(OSError):
                os.unlink(name)


def _log(line: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with contextlib.suppress(OSError, ValueError):
        print(f"{stamp} hwpool supervisor: {line}", flush=True)
