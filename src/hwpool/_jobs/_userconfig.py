"""A user's own hwpool settings: ``$XDG_CONFIG_HOME/hwpool/config.toml`` (else
``~/.config/hwpool/config.toml``), read by ``hwpool submit``.

One key so far: ``notify``, the command run when each of the user's jobs ends (what
``submit --notify`` gives for one job). The file must be the user's own, a regular file
writable by nobody else, never read through a symbolic link: a command others could change
would run as this user. A missing file is no settings; anything else wrong is a ValueError
(an ``UnsafePathError``, an OSError, for an unsafe file) naming the file and the problem.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from .._wire._safety import read_trusted_file

__all__ = ["MAX_NOTIFY", "USER_CONFIG_KEYS", "check_notify", "default_notify", "user_config_path"]

USER_CONFIG_KEYS = ("notify",)
MAX_NOTIFY = 4096
"""The longest notify command (it is stored with each job)."""


def user_config_path(environ: Mapping[str, str]) -> Path:
    """Where the user's settings are: ``$XDG_CONFIG_HOME/hwpool/config.toml``, else
    ``~/.config/hwpool/config.toml``."""
    base = environ.get("XDG_CONFIG_HOME", "")
    folder = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return folder / "hwpool" / "config.toml"


def default_notify(environ: Mapping[str, str]) -> str | None:
    """The user's ``notify`` setting (None: none, or no file)."""
    path = user_config_path(environ)
    try:
        data = read_trusted_file(path, {os.getuid()}, "hwpool user config file")
    except FileNotFoundError:
        return None
    try:
        settings = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{str(path)!r}: not a TOML file: {exc}") from None
    for key in settings:
        if key not in USER_CONFIG_KEYS:
            raise ValueError(
                f"{str(path)!r}: unknown key {key!r} (known: {', '.join(USER_CONFIG_KEYS)})"
            )
    value = settings.get("notify")
    if value is None:
        return None
    return check_notify(value, f"{str(path)!r}: notify")


def check_notify(value: object, name: str = "notify") -> str | None:
    """A notify command: None or "" (none), or a shell command without NUL, at most
    :data:`MAX_NOTIFY` characters."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a shell command (a string), got {value!r}")
    if "\0" in value or len(value) > MAX_NOTIFY:
        raise ValueError(
            f"{name} must be a shell command of at most {MAX_NOTIFY} characters without NUL, "
            f"got {value[:60]!r}"
        )
    return value
