"""What ``hwpool drain`` drained, kept on disk so that a restarted server keeps it drained.

The file lives next to the journal (``<socket>.drain``), a side file like the journal's own
(this server's, mode 0600, never a link: see ``_wire._safety``), replaced whole by a rename,
so a reader sees the old state or the new one. It holds one JSON object::

    {"version": 1, "server": "driver update", "gpus": [[1, "fan noise"]]}

``server``: the whole server's drain reason, or null; ``gpus``: each GPU drained on its own.
No file: nothing is drained. A file that is not valid stops the server's start (it would
otherwise grant on GPUs an admin took out of service).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import NamedTuple

from .._wire._bounds import MAX_REASON
from .._wire._safety import create_side_file, open_side_file

__all__ = ["DrainFileError", "Drained", "drain_path", "load_drained", "save_drained"]

VERSION = 1


class Drained(NamedTuple):
    """What is drained: the whole server (its reason; None: not drained) and each GPU
    drained on its own (index -> reason), sorted by index."""

    server: str | None = None
    gpus: tuple[tuple[int, str], ...] = ()

    def reason_of(self, gpu: int) -> str | None:
        """Why ``gpu`` is drained (the server's reason first), or None if it is not."""
        if self.server is not None:
            return self.server
        return dict(self.gpus).get(gpu)


class DrainFileError(Exception):
    """The drain file cannot be read or is not valid (the message names it)."""


def drain_path(socket_path: Path) -> Path:
    """Where the server of ``socket_path`` keeps what is drained: ``<socket>.drain``."""
    return socket_path.with_name(socket_path.name + ".drain")


def save_drained(path: Path, drained: Drained) -> None:
    """Write ``drained`` to ``path`` atomically (a temporary file renamed over it); nothing
    drained removes the file. OSError when it cannot be written (the old file stays)."""
    if drained == Drained():
        path.unlink(missing_ok=True)
        return
    data = json.dumps(
        {"version": VERSION, "server": drained.server, "gpus": [list(g) for g in drained.gpus]}
    ).encode()
    tmp = path.with_name(path.name + ".tmp")
    fd = create_side_file(tmp, os.O_WRONLY, what="drain file")
    try:
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    finally:
        os.close(fd)


def load_drained(path: Path, num_gpus: int) -> Drained:
    """What ``path`` says is drained on a server of ``num_gpus`` GPUs (no file: nothing);
    DrainFileError naming the file and what is wrong with it."""
    try:
        fd = open_side_file(path, os.O_RDONLY, what="drain file")
    except FileNotFoundError:
        return Drained()
    except OSError as exc:
        raise DrainFileError(f"cannot read the drain file {str(path)!r}: {exc}") from None
    with os.fdopen(fd, "rb") as file:
        data = file.read()
    try:
        return _parse(json.loads(data), num_gpus)
    except (ValueError, TypeError) as exc:
        raise DrainFileError(
            f"the drain file {str(path)!r} is not valid: {exc} (fix it, or remove it to "
            "resume everything)"
        ) from None


def _parse(obj: object, num_gpus: int) -> Drained:
    if not isinstance(obj, dict) or obj.get("version") != VERSION:
        raise ValueError(f"it must be a JSON object with version {VERSION}")
    server = obj.get("server")
    if server is not None:
        server = _reason(server, "server")
    gpus = obj.get("gpus", [])
    if not isinstance(gpus, list):
        raise ValueError(f"gpus must be a list of [index, reason] pairs, got {gpus!r:.80}")
    drained: dict[int, str] = {}
    for item in gpus:
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError(f"gpus must hold [index, reason] pairs, got {item!r:.80}")
        gpu, reason = item
        if type(gpu) is not int or not 0 <= gpu < num_gpus:
            raise ValueError(f"GPU {gpu!r:.20} is not one of this server's {num_gpus} GPUs")
        if gpu in drained:
            raise ValueError(f"GPU {gpu} is listed twice")
        drained[gpu] = _reason(reason, f"GPU {gpu}")
    return Drained(server, tuple(sorted(drained.items())))


def _reason(value: object, whose: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_REASON or not value.isprintable():
        raise ValueError(
            f"the reason of {whose} must be printable text of at most {MAX_REASON} "
            f"characters, got {value!r:.80}"
        )
    return value
