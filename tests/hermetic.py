"""Keeps the suite away from the machine's own hwpool.

On a box where hwpool is deployed as the docs say (a server on ``/run/hwpool``, its config in
``/etc/hwpool/serve.toml``, a per-user server on ``$XDG_RUNTIME_DIR``, jobs under
``~/.local/state``), a test that looked in the default places would take real leases, read
the real config or submit real jobs. So the suite points every such place into a directory
of its own, through the variables the code reads (docs/environment.md):

- machine-wide (every process, whichever user it runs as): ``HWPOOL_SYSTEM_SOCKET`` (a path
  where no server is), ``HWPOOL_CONFIG`` (a file that does not exist);
- this user's (processes of the user who runs the suite): ``XDG_RUNTIME_DIR`` (the per-user
  socket's directory), ``XDG_STATE_HOME`` (the job table);
- and every other ``HWPOOL_*`` variable the caller's shell had is dropped (a
  ``HWPOOL_SOCKET`` would name a real server; others would change what the tests see).

:func:`isolate` sets them in ``os.environ`` once, before any test module is imported (they
copy the environment at import: tests/hostserver.py's ``ENV``), so every process a test starts
from ``os.environ`` inherits them; an environment built from scratch takes :func:`machine`
(another user's) or :func:`own` (this user's).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

MACHINE = ("HWPOOL_SYSTEM_SOCKET", "HWPOOL_CONFIG")
PER_USER = ("XDG_RUNTIME_DIR", "XDG_STATE_HOME")
ROOT_VAR = "TESTS_HWPOOL_HERMETIC_ROOT"
"""Where the suite's own places are (set by :func:`isolate`, inherited by the processes it
starts, so that a nested pytest run reuses them)."""


def isolate() -> Path | None:
    """Point hwpool's places into this run's own directory (made 0755, its per-user part
    0700); return it, or None where an earlier call (or the run that started this one) made
    it already: that one removes it."""
    existing = os.environ.get(ROOT_VAR)
    if existing and Path(existing).is_dir():
        return None
    root = Path(tempfile.mkdtemp(prefix="hwpool-hermetic-", dir="/tmp"))
    root.chmod(0o755)  # other users' processes look for the system socket under it
    runtime = root / "runtime"
    runtime.mkdir(mode=0o700)
    for name in [name for name in os.environ if name.startswith("HWPOOL_")]:
        del os.environ[name]
    os.environ.update(
        {
            ROOT_VAR: str(root),
            "HWPOOL_SYSTEM_SOCKET": str(root / "system" / "hwpool.sock"),
            "HWPOOL_CONFIG": str(root / "etc" / "serve.toml"),
            "XDG_RUNTIME_DIR": str(runtime),
            "XDG_STATE_HOME": str(root / "state"),
        }
    )
    return root


def machine() -> dict[str, str]:
    """The machine-wide variables, for an environment built from scratch (any user's)."""
    return {name: os.environ[name] for name in MACHINE if name in os.environ}


def own() -> dict[str, str]:
    """All of them, for an environment built from scratch for this user's processes."""
    return {name: os.environ[name] for name in (*MACHINE, *PER_USER) if name in os.environ}


def remove(root: Path) -> None:
    """Remove this run's directory (at the end of the session that made it)."""
    shutil.rmtree(root, ignore_errors=True)
