"""The server's defaults that the command line names in its help, on their own: building the
``hwpool`` parser, before every command, loads nothing of the server."""

from pathlib import Path

__all__ = ["DEFAULT_CONFIG", "MAX_REQUESTS_PER_CONNECTION", "MAX_REQUESTS_PER_USER"]

DEFAULT_CONFIG = Path("/etc/hwpool/serve.toml")
"""The machine-wide server's config file, read when it exists (``hwpool serve --config``)."""
MAX_REQUESTS_PER_CONNECTION = 1024
"""The default cap on one connection's leases and waiters together."""
MAX_REQUESTS_PER_USER = 4096
"""The default cap on one uid's leases and waiters, over all its connections."""
