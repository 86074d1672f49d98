"""What the commands that talk to the host server share: errors reported in one line
(:func:`guarded`, :class:`Usage`), the socket to use, user names, and cancelling one
request over a connection (``hwpool cancel`` and ``cancel --user``)."""

from __future__ import annotations

import argparse
import pwd
import sys
from collections.abc import Callable
from pathlib import Path

from .. import _exits
from .._wire._connection import NotServedError, Wire
from .._wire._paths import client_socket, socket_path
from .._wire._protocol import Cancel, Done, ErrorReply, LeaseRecord, WaiterRecord, encode
from ._text import one_line, printable

__all__ = ["FREED", "Command", "Record", "Usage", "cancel_one", "guarded", "socket_of", "user_name"]


Command = Callable[[argparse.Namespace], int]


class Usage(Exception):
    """Bad usage: one line on stderr, exit status 2."""


def guarded(command: Command) -> Command:
    """``command`` with its errors reported in one line: bad usage (exit 2), no server (1), a
    server that does not serve this user (77)."""

    def run(args: argparse.Namespace) -> int:
        try:
            status = command(args)
        except Usage as exc:
            print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
            return _exits.USAGE
        except BrokenPipeError:  # our reader went away (`| head`): main() ends quietly
            raise
        except ConnectionError as exc:
            print(f"hwpool: error: {one_line(str(exc))}", file=sys.stderr)
            return _exits.NOT_MEMBER if isinstance(exc, NotServedError) else _exits.FAILED
        return status

    return run


def socket_of(args: argparse.Namespace, client: bool = True) -> Path:
    """The socket to use: a client's (the machine-wide server first) or, for ``serve``,
    the one to serve on; bad usage for a path that cannot be one."""
    try:
        return client_socket(args.socket).path if client else socket_path(args.socket)
    except ValueError as exc:
        raise Usage(str(exc).replace("socket:", "--socket:", 1)) from None


Record = LeaseRecord | WaiterRecord


FREED = "its GPUs are free once its processes are gone"  # a revoked lease's, see security.md


def cancel_one(wire: Wire, req: int, ident: int, record: Record | None) -> tuple[str, bool]:
    """Cancel ``ident``: the line that says what happened, and whether it was done."""
    wire.send_bytes(encode(Cancel(req, ident)))
    reply = wire.read()
    if isinstance(reply, ErrorReply):
        return one_line(reply.message), False  # the server's message names the id
    if not isinstance(reply, Done):
        raise ConnectionError(f"unexpected reply to cancel: {reply.op}")
    whose = "" if record is None else f" of {_whose(record)}"
    if reply.cancelled == "lease":  # what it was when cancelled (a waiter may have been granted)
        return f"#{ident}: revoked the lease{whose}: {FREED}", True
    if reply.cancelled == "waiter":
        return f"#{ident}: withdrew the waiting request{whose}", True
    return f"#{ident}: cancelled{whose}", True  # a server that does not say which


def _whose(record: Record) -> str:
    """``alice pid 4405 [train]``: the owner and name of a request, escaped."""
    name = "" if record.name is None else f" [{printable(record.name)}]"
    return f"{printable(user_name(record.uid))} pid {record.pid}{name}"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
