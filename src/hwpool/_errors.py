"""Exceptions shared by the pools."""

from __future__ import annotations

__all__ = ["PoolClosedError", "RevokedError", "WouldBlock"]


class WouldBlock(Exception):
    """Raised by a ``*_nowait`` call that cannot be granted without waiting."""


class PoolClosedError(RuntimeError):
    """Raised when a pool is used after ``close()``."""


class RevokedError(RuntimeError):
    """Raised in a request that ``hwpool cancel`` withdrew from the host server's queue."""
