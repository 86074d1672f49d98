"""``hwpool drain`` and ``hwpool resume``: take the server, or some of its GPUs, out of
service and back (admins only: root or the server's admin group).

A drained GPU grants nothing new; leases there run to their end; waiters stay queued and say
why. The server keeps the drain across restarts. Each command prints one line on what it
did; a refusal is one line on stderr: exit 1 when the server refuses the caller (not an
admin), 2 for bad usage (a GPU the server does not have, a bad reason).
"""

from __future__ import annotations

import argparse
import sys

from .. import _exits
from .._wire._connection import Wire
from .._wire._protocol import Done, Drain, ErrorCode, ErrorReply, encode
from ._host_access import guarded, socket_of
from ._text import one_line, printable

__all__ = ["cmd_drain", "cmd_resume"]


def _cmd_drain(args: argparse.Namespace) -> int:
    return _send(args, Drain(1, _gpus(args), args.reason or ""))


def _cmd_resume(args: argparse.Namespace) -> int:
    return _send(args, Drain(1, _gpus(args), resume=True))


def _gpus(args: argparse.Namespace) -> tuple[int, ...]:
    return tuple(dict.fromkeys(args.gpu or ()))


def _send(args: argparse.Namespace, message: Drain) -> int:
    """Ask the server for ``message`` over a control connection; say what happened."""
    wire = Wire(socket_of(args), role="control")  # it works even at the cap on connections
    try:
        wire.send_bytes(encode(message))
        reply = wire.read()
    finally:
        wire.shutdown()
    if isinstance(reply, ErrorReply):
        print(f"hwpool: error: {one_line(reply.message)}", file=sys.stderr)
        refused = reply.code in {ErrorCode.FORBIDDEN, ErrorCode.REPLY_FAILED}
        return _exits.FAILED if refused else _exits.USAGE
    if not isinstance(reply, Done):
        raise ConnectionError(f"unexpected reply to drain: {reply.op}")
    print(_done_line(message))
    return _exits.OK


def _done_line(message: Drain) -> str:
    """``drained GPU 1: driver update``, ``resumed the server``."""
    gpus = message.gpus
    where = (
        "the server" if not gpus
        else f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}"
    )  # fmt: skip
    if message.resume:
        return f"resumed {where}"
    return f"drained {where}" + (f": {printable(message.reason)}" if message.reason else "")


cmd_drain = guarded(_cmd_drain)
cmd_resume = guarded(_cmd_resume)
