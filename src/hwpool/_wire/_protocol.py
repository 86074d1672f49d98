"""The wire protocol between hwpool clients and ``hwpool serve``: pure, versioned and strict.

Framing: one JSON object per line, UTF-8, ending in ``\\n``, at most ``MAX_LINE`` bytes with the
newline. Every object has an ``op``. The client speaks first (``hello``, carrying
``PROTOCOL_VERSION``); the server answers ``welcome`` or a fatal ``error`` and closes. After
that every client request carries ``req``, an int the client picks and never reuses on one
connection; the server answers each request once, with the same ``req`` (an ``acquire``
that waits also gets a ``queued`` first), except ``release``, ``withdraw`` and ``reclaimed``,
which are answered only when they fail; it may push ``revoked`` at any time. A lease may be
handed over to another connection of the same uid: ``give`` answers ``given`` with a secret
ticket, and ``take`` with that ticket answers ``granted`` on the taker's connection. A ``status``
that asks for ``stream`` may be answered in several lines: ``status_part`` lines, then the
``status`` line that ends it (see :func:`status_lines`), so that it fits any queue.
Fields the receiver does not know are ignored, so later versions may add optional ones.

Capacity is counted in the server's units. A server that shares fractions counts
``units_per_gpu`` per GPU. A server sized in memory (``hwpool serve --memory``) says so with
``totals`` (MiB per GPU) in its welcome; a request then says ``"unit": "mib"`` for an amount of
memory, or leaves ``unit`` out for a share of a GPU in ``units_per_gpu`` units (that share of
whichever GPU it lands on; a whole share, or ``count`` > 1, is whole GPUs), so a client that
knows nothing of memory still asks for what it means.

The protocol's face: every name a client or the server uses is importable from here. Its
parts, each with one job: ``_framing`` (version, limits, error codes, lines),
``_fields`` (reading fields of a decoded line), ``_client_messages`` (requests and
:func:`decode_client`), ``_server_messages`` (answers and :func:`decode_server`),
``_status_records`` (the ``status`` answer and its records) and ``_encoding`` (messages to
lines, a long status answer in parts).

These modules do no I/O: they turn bytes into validated messages and back. Decoding raises
:class:`ProtocolError`, whose ``code`` says whether the connection can go on (``fatal``).
``docs/protocol.md`` documents every message.
"""

from __future__ import annotations

from ._bounds import MAX_PRIORITY, MAX_REASON, MAX_TEXT
from ._client_messages import (
    Acquire,
    Bye,
    Cancel,
    ClientMessage,
    Drain,
    Give,
    Hello,
    Reclaim,
    Reclaimed,
    Release,
    Status,
    Take,
    Withdraw,
    decode_client,
    request_for,
)
from ._encoding import encode, join_status, status_lines
from ._framing import (
    MAX_GPUS,
    MAX_LINE,
    PROTOCOL_VERSION,
    TICKET,
    ErrorCode,
    ErrorReply,
    LineBuffer,
    ProtocolError,
    Role,
    Unit,
)
from ._server_messages import (
    Busy,
    Done,
    Given,
    Granted,
    Notice,
    Queued,
    Revoked,
    RevokeReason,
    ServerMessage,
    TakenRequest,
    Welcome,
    decode_server,
)
from ._status_records import (
    MAX_ACCOUNT_NAME,
    MAX_OUTSIDE,
    MAX_OWNERS,
    AccountRecord,
    GPUStateRecord,
    LeaseRecord,
    OutsideRecord,
    OwnerRecord,
    StatusPart,
    StatusReply,
    WaiterRecord,
    WatchRecord,
)

__all__ = [
    "MAX_ACCOUNT_NAME",
    "MAX_GPUS",
    "MAX_LINE",
    "MAX_OUTSIDE",
    "MAX_OWNERS",
    "MAX_PRIORITY",
    "MAX_REASON",
    "MAX_TEXT",
    "PROTOCOL_VERSION",
    "TICKET",
    "AccountRecord",
    "Acquire",
    "Busy",
    "Bye",
    "Cancel",
    "ClientMessage",
    "Done",
    "Drain",
    "ErrorCode",
    "ErrorReply",
    "GPUStateRecord",
    "Give",
    "Given",
    "Granted",
    "Hello",
    "LeaseRecord",
    "LineBuffer",
    "Notice",
    "OutsideRecord",
    "OwnerRecord",
    "ProtocolError",
    "Queued",
    "Reclaim",
    "Reclaimed",
    "Release",
    "RevokeReason",
    "Revoked",
    "Role",
    "ServerMessage",
    "Status",
    "StatusPart",
    "StatusReply",
    "Take",
    "TakenRequest",
    "Unit",
    "WaiterRecord",
    "WatchRecord",
    "Welcome",
    "Withdraw",
    "decode_client",
    "decode_server",
    "encode",
    "join_status",
    "request_for",
    "status_lines",
]
