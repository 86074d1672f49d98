"""``hwpool.connect()``: the GPUPool front over the host server's client instead of its own core.

Everything above the backend is the same code as for a local pool (``GPULease``,
``current_gpus``, the ``acquire*`` methods, their checks and errors), so code written for
``GPUPool`` switches to the host-wide queue by changing one line; with ``HWPOOL_SOCKET`` set,
``GPUPool()`` switches with no change at all.
"""

from __future__ import annotations

import os

from .._backends._unix import UnixBackend
from ._pool import GPUPool

__all__ = ["connect"]


def connect(
    socket: str | os.PathLike[str] | None = None, *, reconnect_timeout: float | None = 30.0
) -> GPUPool:
    """A :class:`GPUPool` that shares this machine's GPUs with every process using ``socket``.

    ``socket`` defaults to ``HWPOOL_SOCKET``, else the machine-wide server's socket
    (``/run/hwpool/hwpool.sock``, or ``HWPOOL_SYSTEM_SOCKET``) when it is there, else
    ``$XDG_RUNTIME_DIR/hwpool/hwpool.sock``, else ``/tmp/hwpool-<uid>/hwpool.sock`` (where
    ``hwpool serve`` listens by default). The server is verified before anything is sent to
    it (its directory, and the uid it runs as: see docs/security.md). One
    connection serves every task and thread of the process; a forked child opens its own.
    If the server goes away, requests (waiting ones, and new ones made meanwhile) wait up to
    ``reconnect_timeout`` seconds for it to come back (None: until it does; leases are
    re-declared to it), then raise ConnectionError, and leases held are dropped. Raises
    ConnectionError at once, naming the socket and how to start a server, if none answers;
    ValueError for a socket path that cannot be one. ``close()`` (or ``with``) gives
    everything back to the server.
    """
    return GPUPool(backend=UnixBackend(socket, reconnect_timeout=reconnect_timeout))
