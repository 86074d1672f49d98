"""Messages to lines: :func:`encode` (the messages of every grant formatted directly, the
rest through their ``wire()``), and a status answer as lines that each fit ``MAX_LINE``
(:func:`status_lines`) and back into one answer (:func:`join_status`)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Sequence

from ._client_messages import Acquire, ClientMessage, Release
from ._fields import _ENCODER
from ._framing import MAX_LINE
from ._server_messages import Granted, Queued, ServerMessage
from ._status_records import LeaseRecord, StatusPart, StatusReply, WaiterRecord


def encode(message: ClientMessage | ServerMessage) -> bytes:
    """One message as its line (compact JSON and a newline); ValueError if over MAX_LINE."""
    line = _plain_line(message)
    if line is None:
        line = _ENCODER.encode(message.wire()).encode() + b"\n"
    if len(line) > MAX_LINE:
        raise ValueError(f"{message.op} message of {len(line)} bytes exceeds {MAX_LINE}")
    return line


_NO_OPTIONS = (None, None, None, None)


def _plain_line(message: ClientMessage | ServerMessage) -> bytes | None:
    """The line of a message every grant exchanges (an ``acquire`` without options, a
    ``queued``, a ``granted`` not of a take, a whole ``release``), formatted directly (a few
    times faster than building its dict and encoding that; the same bytes), else None."""
    kind = type(message)
    if kind is Granted:
        assert isinstance(message, Granted)
        if message.request is not None:
            return None
        gpus = ",".join(map(str, message.gpus))
        return (
            f'{{"op":"granted","req":{message.req},"id":{message.id},"gpus":[{gpus}],'
            f'"units":{message.units}}}\n'
        ).encode()
    if kind is Queued:
        assert isinstance(message, Queued)
        return f'{{"op":"queued","req":{message.req},"id":{message.id}}}\n'.encode()
    if kind is Release:
        assert isinstance(message, Release)
        if message.gpu is not None:
            return None
        return f'{{"op":"release","req":{message.req},"of":{message.of}}}\n'.encode()
    if kind is Acquire:
        assert isinstance(message, Acquire)
        options = (message.name, message.command, message.expected_s, message.limit_s)
        if options != _NO_OPTIONS or message.unit != "gpu" or message.priority:
            return None  # labels, a hint, a unit, a priority or a limit: the general way
        wait = "true" if message.wait else "false"
        return (
            f'{{"op":"acquire","req":{message.req},"count":{message.count},'
            f'"units":{message.units},"wait":{wait}}}\n'
        ).encode()
    return None


# ----------------------------------------------------------------- status in parts
_PART_ROOM = MAX_LINE - 256
"""What the records of one ``status_part`` line may take; the rest is for its other fields."""


def _record_bytes(record: LeaseRecord | WaiterRecord) -> bytes:
    return _ENCODER.encode(record.wire()).encode()


def status_lines(reply: StatusReply, stream: bool) -> Iterator[bytes]:
    """The lines that answer a status with ``reply``, each at most MAX_LINE bytes.

    With ``stream``: ``status_part`` lines holding the leases, then the waiters, in order, as
    many per line as fit, and last the ``status`` line with the free units and counters (and
    empty lists). Without: one ``status`` line, its lists cut to fit and the cut counted in
    its ``*_left_out`` fields. A generator that encodes each record once, when its line is
    asked for, so a server holds one line of a long answer at a time. Any one record fits
    in a line (``name`` and ``command`` are at most MAX_TEXT characters each).
    """
    if stream:
        yield from _parts(reply.req, reply.leases, reply.waiting)
        yield encode(_cut(reply, len(reply.leases), len(reply.waiting), 0, 0))
        return
    room = MAX_LINE - len(encode(_cut(reply, 0, 0, len(reply.leases), len(reply.waiting))))
    kept = []
    for records in (reply.leases, reply.waiting):
        count = 0
        for record in records:
            size = len(_record_bytes(record)) + 1
            if size > room:
                room = 0  # what follows a record that did not fit stays out too
                break
            room -= size
            count += 1
        kept.append(count)
    left_out = len(reply.leases) - kept[0], len(reply.waiting) - kept[1]
    yield encode(_cut(reply, 0, 0, *left_out))


def _parts(
    req: int, leases: Sequence[LeaseRecord], waiting: Sequence[WaiterRecord]
) -> Iterator[bytes]:
    """The ``status_part`` lines that carry ``leases`` and ``waiting``, each as full as fits
    (the records are read one by one, as the lines are asked for)."""
    chunks: tuple[list[bytes], list[bytes]] = ([], [])
    size = 0
    records: Iterator[tuple[int, LeaseRecord | WaiterRecord]] = itertools.chain(
        ((0, r) for r in leases), ((1, r) for r in waiting)
    )
    for kind, record in records:
        data = _record_bytes(record)
        if size + len(data) + 1 > _PART_ROOM and size:
            yield _part_line(req, *chunks)
            chunks, size = ([], []), 0
        chunks[kind].append(data)
        size += len(data) + 1
    if size:
        yield _part_line(req, *chunks)


def _part_line(req: int, leases: list[bytes], waiting: list[bytes]) -> bytes:
    """One ``status_part`` line (as ``StatusPart.wire`` has it) from encoded records."""
    return b"".join(
        (b'{"op":"status_part","req":', str(req).encode(), b',"leases":[', b",".join(leases),
         b'],"waiting":[', b",".join(waiting), b"]}\n")
    )  # fmt: skip


def _cut(
    reply: StatusReply, lease_at: int, waiter_at: int, leases_out: int, waiting_out: int
) -> StatusReply:
    """``reply`` with the records from ``lease_at`` and ``waiter_at`` on, less the last
    ``leases_out`` and ``waiting_out`` of them (counted as left out)."""
    return dataclasses.replace(
        reply,
        leases=reply.leases[lease_at : len(reply.leases) - leases_out],
        waiting=reply.waiting[waiter_at : len(reply.waiting) - waiting_out],
        leases_left_out=leases_out,
        waiting_left_out=waiting_out,
    )


def join_status(parts: Iterable[StatusPart], last: StatusReply) -> StatusReply:
    """The whole answer from its ``status_part`` lines and the ``status`` that ended it."""
    leases: list[LeaseRecord] = []
    waiting: list[WaiterRecord] = []
    for part in parts:
        leases += part.leases
        waiting += part.waiting
    if not leases and not waiting:
        return last
    return dataclasses.replace(
        last, leases=(*leases, *last.leases), waiting=(*waiting, *last.waiting)
    )
