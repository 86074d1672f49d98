"""``hwpool submit``'s question to the server before anything is queued: does it serve this
user, and could it ever grant the request?

The supervisor will ask the same server later, when nobody is there to read its answer: a
user it does not serve would be queued for ever (the supervisor retrying), a request larger
than the server cancelled later with a reason few would look for. So ``hwpool submit``
connects first (starting the per-user server where ``hwpool run`` would), and refuses at once
what cannot be: the error says why, and the exit status which (``hwpool._exits``).
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

from .. import _exits
from .._core._memory import format_mib
from .._gpu._pool import GPUPool
from .._wire._connection import NotServedError
from .._wire._paths import ClientSocket
from . import _autostart, _env
from ._text import plural

__all__ = ["ServerRefusal", "check_request"]


class ServerRefusal(Exception):
    """The server cannot run the job: ``status`` is the exit status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_request(
    server: ClientSocket, gpus: Fraction | int | None, memory_mib: int | None
) -> None:
    """ServerRefusal unless the server of ``server`` serves this user and could grant
    ``gpus`` (default one GPU) or ``memory_mib`` of one GPU: 77 (not served), 125 (no server
    answers, none could be started), 2 (a request larger than that server, or of a kind it
    does not share)."""
    autostart = _env.autostart_from_env(os.environ) and server.per_user
    try:
        backend = _autostart.connect(
            server.path, autostart=autostart, name="hwpool submit", command=None,
            memory=memory_mib is not None,
        )  # fmt: skip
    except NotServedError as exc:
        raise ServerRefusal(_exits.NOT_MEMBER, str(exc)) from None
    except ConnectionError as exc:
        raise ServerRefusal(_exits.HWPOOL_FAILED, str(exc)) from None
    try:
        _grantable(GPUPool(backend=backend), gpus, memory_mib, server.path)
    finally:
        backend.close()


def _grantable(
    pool: GPUPool, gpus: Fraction | int | None, memory_mib: int | None, path: Path
) -> None:
    """ServerRefusal (2) naming the option, the value and the server's capacity unless
    ``pool`` could ever grant the request (as the supervisor will ask for it)."""
    where = f"the server at {str(path)!r}"
    if memory_mib is not None:
        try:
            pool._one_demand(None, memory_mib)
        except ValueError as exc:
            raise ServerRefusal(
                _exits.USAGE, f"--mem {format_mib(memory_mib)}: {exc} ({where})"
            ) from None
        return
    if isinstance(gpus, int) and gpus > pool.num_gpus:
        raise ServerRefusal(
            _exits.USAGE, f"--gpus {gpus}: {where} has {plural(pool.num_gpus, 'GPU')}"
        )
    try:
        if isinstance(gpus, int):
            pool._whole_demand(gpus)
        else:
            pool._one_demand(1.0 if gpus is None else float(gpus), None)
    except ValueError as exc:
        raise ServerRefusal(_exits.USAGE, f"--gpus {gpus}: {exc} ({where})") from None
