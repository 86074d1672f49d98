"""The server's defaults that the command line names in its help, on their own: building the
``hwpool`` parser, before every command, loads nothing of the server."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "CONFIG_VAR", "DEFAULT_CONFIG", "HANDOVER_S", "MAX_REQUESTS_PER_CONNECTION",
    "MAX_REQUESTS_PER_USER", "REVOKED_HOLD_S", "REVOKED_RECHECK_S", "default_config",
]  # fmt: skip

CONFIG_VAR = "HWPOOL_CONFIG"
DEFAULT_CONFIG = Path("/etc/hwpool/serve.toml")
"""The machine-wide server's config file, read when it exists (``hwpool serve --config``)."""
MAX_REQUESTS_PER_CONNECTION = 1024
"""The default cap on one connection's leases and waiters together."""
MAX_REQUESTS_PER_USER = 4096
"""The default cap on one uid's leases and waiters, over all its connections."""
REVOKED_HOLD_S = 15.0
"""How long a revoked lease's GPUs stay held at most while its connection stays open and no
job of its holder runs: a job's SIGTERM grace (10 s for a launcher, 5 s for ``hwpool run``)
and a margin for its holder to see it gone and close the connection."""
REVOKED_RECHECK_S = 5.0
"""Past that, while the holder's job still runs, how often the hold is looked at again."""
HANDOVER_S = 30.0
"""How long a lease offered for hand-over (``give``) waits to be taken: then the offer is
withdrawn and the lease released (its taker died, or could not be started), so that no GPU
is held for good by an offer nobody will take. A launcher takes its lease within a second or
two of its start."""


def default_config(environ: Mapping[str, str] | None = None) -> Path | None:
    """The machine-wide server's config file: ``HWPOOL_CONFIG`` (empty: none), else
    ``/etc/hwpool/serve.toml``; ValueError, naming the variable and the value, for a
    relative path. A test suite (or a second deployment) points it elsewhere, so that it
    never reads the machine's own file."""
    env = os.environ if environ is None else environ
    raw = env.get(CONFIG_VAR)
    if raw is None:
        return DEFAULT_CONFIG
    if not raw:
        return None
    if not os.path.isabs(raw):
        raise ValueError(f"{CONFIG_VAR} must be an absolute path, got {raw!r}")
    return Path(raw)
