"""The wire protocol: every message round-trips, and every malformed line is refused by code."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hwpool import GPUInfo
from hwpool._check import check_bool
from hwpool._wire import _protocol as p
from hwpool._wire._fields import _ENCODER
from hwpool._wire._framing import MAX_MESSAGE
from hwpool._wire._protocol import ErrorCode, ProtocolError

CLIENT_MESSAGES: list[p.ClientMessage] = [
    p.Hello(p.PROTOCOL_VERSION, "hwpool 0.2.0"),
    p.Hello(p.PROTOCOL_VERSION, "hwpool 0.2.0", token="0f" * 16),
    p.Hello(p.PROTOCOL_VERSION, "hwpool 0.2.0", role="control"),
    p.Acquire(1, 1, 500_000, True),
    p.Acquire(2, 2, 1_000_000, False, name="train", command="python train.py"),
    p.Acquire(3, 1, 5, True, expected_s=2.5),
    p.Acquire(4, 1, 6144, True, unit="mib"),
    p.Acquire(5, 1, 5, True, priority=-p.MAX_PRIORITY),
    p.Acquire(6, 1, 5, True, priority=p.MAX_PRIORITY),
    p.Withdraw(3, 1, timed_out=True),
    p.Release(4, 2),
    p.Release(5, 2, gpu=1, units=250_000),
    p.Reclaim(6, 17, 2, 1_000_000, ((0, 1_000_000), (1, 1_000_000)), 3.5, name="tp"),
    p.Reclaim(7, 18, 1, 100, None, 0.0),
    p.Reclaim(7, 19, 1, 6144, ((1, 6144),), 2.0, unit="mib"),
    p.Reclaim(7, 19, 1, 6144, ((1, 6144),), 2.0, unit="mib", limit_s=30.0),
    p.Acquire(3, 1, 500_000, True, limit_s=0.5),
    p.Reclaimed(8),
    p.Status(9),
    p.Status(9, stream=True),
    p.Cancel(10, 17),
    p.Bye(11),
    p.Give(12, 17),
    p.Take(13, 17, "Ab0_-" * 6 + "xy"),
    p.Take(13, 17, "t" * 16, name="j3 train.py", command="python train.py"),
]

SERVER_MESSAGES: list[p.ServerMessage] = [
    p.Welcome(1, "hwpool 0.2.0", 42, 0, 1_000_000,
              (GPUInfo(0, "0"), GPUInfo(1, "GPU-x", "GPU-x", 80)), False),
    p.Welcome(1, "hwpool 0.2.0", 42, 0, 1_000_000,
              (GPUInfo(0, "GPU-a", "GPU-a", 81920, "NVIDIA H100"),
               GPUInfo(1, "MIG-b", "MIG-b", 24576, "1g.24gb", parent="GPU-c")),
              False, (81920, 24576)),
    p.Granted(1, 5, (0, 1), 1_000_000),
    p.Granted(1, 5, (0, 1), 0),
    p.Granted(1, 5, (0,), 500_000, p.TakenRequest(1, 500_000, 2.5)),
    p.Granted(
        1, 5, (0,), 6144,
        p.TakenRequest(1, 6144, 0.0, "mib", 30.0, name="j3", command="python train.py"),
    ),
    p.Given(2, 5, "Ab0_-" * 6 + "xy"),
    p.Queued(2, 6),
    p.Busy(3),
    p.Done(4),
    p.Done(4, "lease"),
    p.Done(4, "waiter"),
    p.Revoked(5, 5, 0),
    p.Revoked(5, 5, 1000, "limit"),
    p.ErrorReply(6, ErrorCode.NOT_FOUND, "no lease 9"),
    p.ErrorReply(None, ErrorCode.TOO_LONG, "too long"),
    p.StatusReply(
        7, (0, 500_000),
        (p.LeaseRecord(5, 0, 99, ((0, 1_000_000),), 1.25, name="x", command="y"),),
        (p.WaiterRecord(6, 1000, 100, 1, 600_000, (1,), 0.5),
         p.WaiterRecord(8, 1000, 100, 1, 6144, (), 0.5, unit="mib")),
        3, 2, 1, 0, 0.0, 12.0,
    ),
    p.StatusReply(7, (0,), (), (), 3, 2, 1, 0, 0.0, 12.0, leases_left_out=2, waiting_left_out=9),
    p.StatusReply(
        7, (0,), (), (), 3, 2, 1, 0, 0.0, 12.0,
        owners=(p.OwnerRecord(1000, 2.0, 3600.5, 1.5, 3), p.OwnerRecord(0, 1.0, 0.0, 0.0, 0)),
        owners_left_out=4,
    ),
    p.StatusReply(
        7, (0,), (),
        (p.WaiterRecord(6, 1000, 100, 1, 600_000, (1,), 0.5, account="ml-team"),),
        3, 2, 1, 0, 0.0, 12.0,
        owners=(p.OwnerRecord(2000, 1.0, 0.0, 0.0, 0),),
        accounts=(p.AccountRecord("ml-team", 3.0, 7200.25, 2.5, 1),),
    ),
    p.StatusReply(
        7, (0,), (), (), 3, 2, 1, 0, 0.0, 12.0,
        accounts=(p.AccountRecord("ops", 1.0, 0.0, 0.0, 2),), owners_left_out=1,
    ),
    p.StatusPart(
        7, (p.LeaseRecord(5, 0, 99, ((0, 1_000_000),), 1.25, name="x"),),
        (p.WaiterRecord(6, 1000, 100, 1, 600_000, (1,), 0.5, command="z"),
         p.WaiterRecord(9, 1000, 100, 1, 5, (), 0.5, held="uid 1000 at the limit of ...")),
    ),
    p.ErrorReply(8, ErrorCode.REPLY_FAILED, "could not encode"),
]  # fmt: skip


@pytest.mark.parametrize("message", CLIENT_MESSAGES, ids=lambda m: m.op)
def test_client_messages_round_trip(message: p.ClientMessage) -> None:
    line = p.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert p.decode_client(line[:-1]) == message


@pytest.mark.parametrize("message", SERVER_MESSAGES, ids=lambda m: m.op)
def test_server_messages_round_trip(message: p.ServerMessage) -> None:
    assert p.decode_server(p.encode(message)[:-1]) == message


@pytest.mark.parametrize("message", CLIENT_MESSAGES + SERVER_MESSAGES, ids=lambda m: m.op)
def test_every_line_is_the_compact_json_of_its_message(
    message: p.ClientMessage | p.ServerMessage,
) -> None:
    # the messages of every grant are formatted directly: the same bytes as the general way
    assert p.encode(message) == _ENCODER.encode(message.wire()).encode() + b"\n"


@pytest.mark.parametrize("gpus", [[0, True], [-1], [0, 1.0], [p.MAX_GPUS], ["0"]])
def test_a_granted_with_a_bad_gpu_is_refused(gpus: list[object]) -> None:
    line = json.dumps({"op": "granted", "req": 1, "id": 2, "gpus": gpus, "units": 5}).encode()
    with pytest.raises(ProtocolError) as info:
        p.decode_server(line)
    assert info.value.code is ErrorCode.BAD_MESSAGE and "gpus" in info.value.message


def test_error_codes_say_which_are_fatal() -> None:
    assert ErrorCode.TOO_LONG.fatal and ErrorCode.BAD_JSON.fatal and ErrorCode.VERSION.fatal
    assert not ErrorCode.UNKNOWN_OP.fatal and not ErrorCode.BAD_MESSAGE.fatal
    assert not ErrorCode.FORBIDDEN.fatal and not ErrorCode.NOT_FOUND.fatal


def _refused(line: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        p.decode_client(line)
    return info.value


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"{not json", ErrorCode.BAD_JSON),
        (b"\xff\xfe", ErrorCode.BAD_JSON),
        (b"[1, 2]", ErrorCode.BAD_JSON),
        (b'"hello"', ErrorCode.BAD_JSON),
        (b"[" * 100_000, ErrorCode.BAD_JSON),
        (b"{}", ErrorCode.BAD_MESSAGE),
        (b'{"op": 3}', ErrorCode.BAD_MESSAGE),
        (b'{"op": "format_disk", "req": 1}', ErrorCode.UNKNOWN_OP),
        (b'{"op": "acquire", "req": 1, "count": 1, "units": 5}', ErrorCode.BAD_MESSAGE),
    ],
)
def test_malformed_lines_are_refused_by_code(line: bytes, code: ErrorCode) -> None:
    assert _refused(line).code is code


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"req": True}, "req"),
        ({"req": -1}, "req"),
        ({"req": 2**60}, "req"),
        ({"req": 1.0}, "req"),
        ({"count": 0}, "count"),
        ({"count": "2"}, "count"),
        ({"units": 0}, "units"),
        ({"units": None}, "units"),
        ({"wait": 1}, "wait"),
        ({"name": 5}, "name"),
        ({"name": "x" * (p.MAX_TEXT + 1)}, "name"),
        ({"expected_s": -1}, "expected_s"),
        ({"expected_s": "5"}, "expected_s"),
        ({"expected_s": True}, "expected_s"),
        ({"expected_s": 1e999}, "expected_s"),
        ({"unit": "GiB"}, "unit"),
        ({"unit": None}, "unit"),
        ({"priority": p.MAX_PRIORITY + 1}, "priority"),
        ({"priority": -p.MAX_PRIORITY - 1}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"priority": True}, "priority"),
        ({"limit_s": 0}, "limit_s"),
        ({"limit_s": -1}, "limit_s"),
        ({"limit_s": 1e999}, "limit_s"),
        ({"limit_s": "5"}, "limit_s"),
        ({"limit_s": True}, "limit_s"),
    ],
)
def test_bad_acquire_fields_are_named(fields: dict[str, object], named: str) -> None:
    obj = {"op": "acquire", "req": 1, "count": 1, "units": 5, "wait": True, **fields}
    error = _refused(json.dumps(obj).encode())
    assert error.code is ErrorCode.BAD_MESSAGE and named in error.message
    assert error.reply().code is ErrorCode.BAD_MESSAGE


def test_error_reply_carries_the_req_when_it_is_readable() -> None:
    line = json.dumps({"op": "acquire", "req": 7, "count": 0, "units": 5, "wait": True})
    assert _refused(line.encode()).req == 7
    assert _refused(b'{"op": "nope", "req": "x"}').req is None


@pytest.mark.parametrize(
    "obj",
    [
        {"op": "release", "req": 1, "of": 2, "gpu": 0},
        {"op": "release", "req": 1, "of": 2, "units": 5},
        {"op": "reclaim", "req": 1, "id": 2, "count": 1, "units": 5, "held": [], "age_s": 0},
        {"op": "reclaim", "req": 1, "id": 2, "count": 1, "units": 5, "held": [[0]], "age_s": 0},
        {"op": "reclaim", "req": 1, "id": 2, "count": 1, "units": 5, "held": None, "age_s": -1},
        {"op": "reclaim", "req": 1, "id": 2, "count": 1, "units": 5, "held": None, "age_s": 1e999},
        {"op": "cancel", "req": 1, "id": 0},
        {"op": "hello", "version": "1", "client": "x"},
        {"op": "withdraw", "req": 1, "of": 2},
    ],
)
def test_other_bad_fields_are_refused(obj: dict[str, object]) -> None:
    assert _refused(json.dumps(obj).encode()).code is ErrorCode.BAD_MESSAGE


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"token": ""}, "token"),
        ({"token": "x" * 65}, "token"),
        ({"token": "a b"}, "token"),
        ({"token": "tok\n"}, "token"),
        ({"token": 7}, "token"),
        ({"role": "admin"}, "role"),
        ({"role": None}, "role"),
    ],
)
def test_bad_hello_tokens_and_roles_are_named(fields: dict[str, object], named: str) -> None:
    obj = {"op": "hello", "version": 1, "client": "x", **fields}
    error = _refused(json.dumps(obj).encode())
    assert error.code is ErrorCode.BAD_MESSAGE and named in error.message


def test_a_hello_without_token_or_role_is_a_data_connection() -> None:
    hello = p.decode_client(b'{"op": "hello", "version": 1, "client": "old"}')
    assert hello == p.Hello(1, "old", None, "data")
    assert json.loads(p.encode(hello)) == {"op": "hello", "version": 1, "client": "old"}


@pytest.mark.parametrize("held", [[[0, 5], [0, 1]], [[1, 2], [0, 3], [1, 2]]])
def test_a_reclaim_naming_a_gpu_twice_is_refused(held: list[list[int]]) -> None:
    obj = {"op": "reclaim", "req": 1, "id": 2, "count": 1, "units": 5, "held": held, "age_s": 0}
    error = _refused(json.dumps(obj).encode())
    assert error.code is ErrorCode.BAD_MESSAGE and "more than once" in error.message
    assert error.req == 1


def test_unknown_fields_are_ignored_for_later_versions() -> None:
    obj = {"op": "status", "req": 3, "since_v2": [1, 2]}
    assert p.decode_client(json.dumps(obj).encode()) == p.Status(3)


def test_welcome_must_list_gpus_in_order() -> None:
    good = json.loads(p.encode(SERVER_MESSAGES[0]))
    good["gpus"].reverse()
    with pytest.raises(ProtocolError, match="in order"):
        p.decode_server(json.dumps(good).encode())


@pytest.mark.parametrize("totals", [[81920], [81920, 0], "81920", [81920, -1]])
def test_welcome_totals_must_size_every_gpu(totals: object) -> None:
    good = json.loads(p.encode(SERVER_MESSAGES[1]))
    good["totals"] = totals
    with pytest.raises(ProtocolError, match="totals"):
        p.decode_server(json.dumps(good).encode())


def test_unknown_server_error_code_is_refused() -> None:
    line = b'{"op": "error", "req": 1, "code": "gremlins", "message": ""}'
    with pytest.raises(ProtocolError, match="gremlins"):
        p.decode_server(line)


# ----------------------------------------------------------------- framing
def test_line_buffer_splits_and_keeps_the_rest() -> None:
    buf = p.LineBuffer()
    assert buf.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert buf.partial
    assert buf.feed(b":2}\n\n") == [b'{"b":2}', b""]
    assert not buf.partial


def test_line_buffer_accepts_a_line_of_exactly_the_cap() -> None:
    buf = p.LineBuffer()
    line = b"x" * (p.MAX_LINE - 1)
    assert buf.feed(line[:1000]) == []
    assert buf.feed(line[1000:] + b"\n") == [line]


@pytest.mark.parametrize("chunks", [[b"x" * p.MAX_LINE], [b"x" * 40_000, b"x" * 40_000 + b"\n"]])
def test_line_buffer_refuses_an_oversized_line_before_it_ends(chunks: list[bytes]) -> None:
    buf = p.LineBuffer()
    with pytest.raises(ProtocolError) as info:
        for chunk in chunks:
            buf.feed(chunk)
    assert info.value.code is ErrorCode.TOO_LONG


def test_encode_refuses_what_the_peer_would_refuse() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        p.encode(p.Acquire(1, 1, 5, True, command="x" * p.MAX_LINE))


def test_check_bool_accepts_only_bools() -> None:
    assert check_bool("wait", False) is False
    with pytest.raises(TypeError, match="wait must be a bool, got 0"):
        check_bool("wait", 0)


# ----------------------------------------------------------------- status of any size
def _waiters(count: int, text: str) -> tuple[p.WaiterRecord, ...]:
    return tuple(
        p.WaiterRecord(100 + n, 1000, 7, 1, 5, (0,), 1.0, text, f"{n} {text}"[: p.MAX_TEXT])
        for n in range(count)
    )


def _big_status(leases: int, waiters: int, text: str) -> p.StatusReply:
    held = tuple(p.LeaseRecord(n + 1, 0, 9, ((0, 1),), 2.0, text, text) for n in range(leases))
    return p.StatusReply(3, (0, 7), held, _waiters(waiters, text), 5, 4, 3, 2, 0.0, 9.0)


@pytest.mark.parametrize(
    ("leases", "waiters", "text"),
    [
        (0, 0, ""),
        (2, 3, "short"),
        (16, 0, "n" * p.MAX_TEXT),  # 16 requests with 4 KiB names: over 64 KiB in one line
        (40, 900, "\x1b\n" * (p.MAX_TEXT // 2)),  # escaped by JSON: 6 bytes a character
        (0, 2000, "é" * 1000),
    ],
    ids=["empty", "small", "16 long names", "900 escaped", "2000 waiters"],
)
def test_a_streamed_status_of_any_size_comes_whole_in_lines_that_fit(
    leases: int, waiters: int, text: str
) -> None:
    reply = _big_status(leases, waiters, text)
    lines = list(p.status_lines(reply, stream=True))
    assert all(len(line) <= p.MAX_LINE and line.endswith(b"\n") for line in lines)
    *parts, last = [p.decode_server(line) for line in lines]
    assert all(isinstance(part, p.StatusPart) and part.req == 3 for part in parts)
    assert isinstance(last, p.StatusReply) and last.leases == () and last.waiting == ()
    assert p.join_status(parts, last) == reply  # type: ignore[arg-type]


def test_a_one_line_status_is_cut_to_fit_and_says_how_much_was_left_out() -> None:
    reply = _big_status(16, 900, "n" * p.MAX_TEXT)
    (line,) = p.status_lines(reply, stream=False)
    assert len(line) <= p.MAX_LINE
    cut = p.decode_server(line)
    assert isinstance(cut, p.StatusReply)
    assert cut.leases == reply.leases[: len(cut.leases)] and 0 < len(cut.leases) < 16
    assert (cut.leases_left_out, cut.waiting_left_out) == (16 - len(cut.leases), 900)
    assert cut.free == reply.free and cut.granted == 5


def test_a_status_that_fits_is_the_one_line_it_always_was() -> None:
    reply = _big_status(2, 3, "short")
    assert list(p.status_lines(reply, stream=False)) == [p.encode(reply)]
    assert b"left_out" not in p.encode(reply)


def test_status_part_lines_are_status_part_messages() -> None:
    reply = _big_status(1, 1, "x")
    part, _ = p.status_lines(reply, stream=True)
    assert json.loads(part) == p.StatusPart(3, reply.leases, reply.waiting).wire()


def test_a_lone_surrogate_in_a_text_field_is_refused_by_name() -> None:
    line = b'{"op":"acquire","req":1,"count":1,"units":5,"wait":true,"name":"a\\ud800"}'
    with pytest.raises(ProtocolError, match="name holds a lone surrogate") as info:
        p.decode_client(line)
    assert info.value.code is ErrorCode.BAD_MESSAGE and info.value.req == 1
    good = b'{"op":"acquire","req":1,"count":1,"units":5,"wait":true,"name":"\\ud83d\\ude00"}'
    assert p.decode_client(good) == p.Acquire(1, 1, 5, True, name="\U0001f600")


def test_an_error_message_is_cut_so_that_its_line_always_fits() -> None:
    error = p.ErrorReply(1, ErrorCode.BAD_MESSAGE, "quoted " + "[1, " * 30_000)
    line = p.encode(error)
    message = p.decode_server(line)
    assert isinstance(message, p.ErrorReply) and len(message.message) == MAX_MESSAGE
    assert message.message.endswith("...")


def test_status_stream_must_be_a_bool() -> None:
    with pytest.raises(ProtocolError, match="stream"):
        p.decode_client(b'{"op":"status","req":1,"stream":"yes"}')


def test_a_status_says_why_the_journal_cannot_be_written_only_when_it_cannot() -> None:
    plain = p.StatusReply(7, (0,), (), (), 0, 0, 0, 0, 0.0, 1.0)
    assert b"journal_error" not in p.encode(plain)  # what older clients read, unchanged
    failing = p.StatusReply(7, (0,), (), (), 0, 0, 0, 0, 0.0, 1.0, journal_error="ENOSPC")
    assert p.decode_server(p.encode(failing)[:-1]) == failing
    with pytest.raises(ProtocolError, match="journal_error"):
        p.decode_server(p.encode(plain)[:-2] + b',"journal_error":5}')


def test_a_priority_is_sent_only_when_it_is_not_the_default() -> None:
    assert "priority" not in p.Acquire(1, 1, 5, True).wire()
    assert p.Acquire(1, 1, 5, True, priority=-3).wire()["priority"] == -3
    line = json.dumps({"op": "acquire", "req": 1, "count": 1, "units": 5, "wait": True})
    assert p.decode_client(line.encode()) == p.Acquire(1, 1, 5, True)  # an older client's


def test_owners_are_sent_only_when_there_are_some_and_checked() -> None:
    plain = p.StatusReply(7, (0,), (), (), 0, 0, 0, 0, 0.0, 1.0)
    assert "owners" not in plain.wire()  # as before: an older client sees what it saw
    wire = plain.wire() | {"owners": [{"uid": 5, "share": 0, "usage_gpu_s": 1.0,
                                       "running": 0.0, "queued": 0}]}  # fmt: skip
    with pytest.raises(ProtocolError, match="share must be a finite number > 0"):
        p.decode_server(json.dumps(wire).encode())


def test_accounts_come_beside_the_owners_so_an_older_client_reads_the_owners_as_before() -> None:
    """An account is no uid: its record goes in ``accounts``, which an older client ignores,
    and ``owners`` keeps only records with a uid (an older client requires one)."""
    reply = p.StatusReply(
        7, (0,), (), (), 0, 0, 0, 0, 0.0, 1.0,
        accounts=(p.AccountRecord("ml", 2.0, 1.0, 0.5, 1),),
    )  # fmt: skip
    wire = reply.wire()
    assert wire["owners"] == [] and wire["owners_left_out"] == 0
    assert wire["accounts"] == [
        {"account": "ml", "share": 2.0, "usage_gpu_s": 1.0, "running": 0.5, "queued": 1}
    ]
    assert "account" not in p.WaiterRecord(6, 1000, 100, 1, 5, (), 0.5).wire()
    bad = wire | {"accounts": [{"account": "x" * 65, "share": 1, "usage_gpu_s": 0,
                                "running": 0, "queued": 0}]}  # fmt: skip
    with pytest.raises(ProtocolError, match="account is longer than 64"):
        p.decode_server(json.dumps(bad).encode())
    bad["accounts"][0] |= {"account": "ml", "share": 0}  # type: ignore[index]
    with pytest.raises(ProtocolError, match="share must be a finite number > 0"):
        p.decode_server(json.dumps(bad).encode())


def test_a_long_status_keeps_its_owners_and_accounts_in_the_last_line() -> None:
    half = p.MAX_OWNERS // 2
    owners = tuple(p.OwnerRecord(2**32 - 1 - n, 1.0, 1e9, 4096.0, 10**6) for n in range(half))
    accounts = tuple(
        p.AccountRecord(f"{n:04d}" + "a" * (p.MAX_ACCOUNT_NAME - 4), 1e9, 1e9, 4096.0, 10**6)
        for n in range(p.MAX_OWNERS - half)
    )
    reply = dataclasses.replace(_big_status(300, 3000, "x" * 100), owners=owners, accounts=accounts)
    for stream in (True, False):
        lines = list(p.status_lines(reply, stream))
        assert all(len(line) <= p.MAX_LINE for line in lines)
        last = p.decode_server(lines[-1])
        assert isinstance(last, p.StatusReply)
        assert (last.owners, last.accounts) == (owners, accounts)


def test_a_long_status_keeps_its_owners_in_the_last_line() -> None:
    owners = tuple(p.OwnerRecord(uid, 1.0, 1e9, 4096.0, 10**6) for uid in range(p.MAX_OWNERS))
    reply = dataclasses.replace(_big_status(300, 3000, "x" * 100), owners=owners)
    for stream in (True, False):
        lines = list(p.status_lines(reply, stream))
        assert all(len(line) <= p.MAX_LINE for line in lines)
        last = p.decode_server(lines[-1])
        assert isinstance(last, p.StatusReply) and last.owners == owners


def test_a_limit_is_sent_only_when_given_and_named_with_its_value_when_bad() -> None:
    assert "limit_s" not in p.Acquire(1, 1, 5, True).wire()
    assert p.Acquire(1, 1, 5, True, limit_s=2.5).wire()["limit_s"] == 2.5
    line = b'{"op":"acquire","req":1,"count":1,"units":5,"wait":true,"limit_s":NaN}\n'
    error = _refused(line)
    assert error.code in (ErrorCode.BAD_MESSAGE, ErrorCode.BAD_JSON)
    zero = _refused(b'{"op":"acquire","req":1,"count":1,"units":5,"wait":true,"limit_s":0}\n')
    assert "limit_s must be a finite number of seconds > 0, got 0.0" in zero.message
    bad = _refused(b'{"op":"reclaim","req":1,"id":2,"count":1,"units":5,"held":null,'
                   b'"age_s":1,"limit_s":-3}\n')  # fmt: skip
    assert bad.code is ErrorCode.BAD_MESSAGE and "limit_s" in bad.message


def test_a_revoked_reason_other_than_limit_reads_as_a_cancel() -> None:
    line = b'{"op":"revoked","req":1,"id":2,"by":0,"reason":"later"}\n'
    assert p.decode_server(line) == p.Revoked(1, 2, 0)
    assert "reason" not in p.Revoked(1, 2, 0).wire()


TICKET = "a" * 32


@pytest.mark.parametrize(
    ("obj", "named"),
    [
        ({"op": "give", "req": 1}, "id"),
        ({"op": "give", "req": 1, "id": 0}, "id"),
        ({"op": "give", "req": 1, "id": "3"}, "id"),
        ({"op": "give", "id": 3}, "req"),
        ({"op": "take", "req": 1, "id": 3}, "ticket"),
        ({"op": "take", "req": 1, "id": 3, "ticket": "a" * 15}, "ticket"),
        ({"op": "take", "req": 1, "id": 3, "ticket": "a" * 65}, "ticket"),
        ({"op": "take", "req": 1, "id": 3, "ticket": "a" * 31 + "="}, "ticket"),
        ({"op": "take", "req": 1, "id": 3, "ticket": 12345678901234567}, "ticket"),
        ({"op": "take", "req": 1, "id": 0, "ticket": TICKET}, "id"),
        ({"op": "take", "req": 1, "id": 3, "ticket": TICKET, "name": 5}, "name"),
        ({"op": "take", "req": 1, "id": 3, "ticket": TICKET, "command": "x" * 4097}, "command"),
    ],
)
def test_bad_give_and_take_fields_are_named(obj: dict[str, object], named: str) -> None:
    error = _refused(json.dumps(obj).encode())
    assert error.code is ErrorCode.BAD_MESSAGE and named in error.message, error.message


@pytest.mark.parametrize(
    ("obj", "named"),
    [
        ({"op": "given", "req": 1, "id": 3, "ticket": "short"}, "ticket"),
        ({"op": "given", "req": 1, "id": 3}, "ticket"),
        ({"op": "granted", "req": 1, "id": 3, "gpus": [0], "units": 5, "request": 7}, "request"),
        ({"op": "granted", "req": 1, "id": 3, "gpus": [0], "units": 5,
          "request": {"count": 0, "units": 5, "age_s": 0}}, "count"),
        ({"op": "granted", "req": 1, "id": 3, "gpus": [0], "units": 5,
          "request": {"count": 1, "units": 5}}, "age_s"),
        ({"op": "granted", "req": 1, "id": 3, "gpus": [0], "units": 5,
          "request": {"count": 1, "units": 5, "age_s": 0, "limit_s": 0}}, "limit_s"),
        ({"op": "granted", "req": 1, "id": 3, "gpus": [0], "units": 5,
          "request": {"count": 1, "units": 5, "age_s": 0, "unit": "GiB"}}, "unit"),
    ],
)  # fmt: skip
def test_bad_given_and_taken_fields_are_named(obj: dict[str, object], named: str) -> None:
    with pytest.raises(ProtocolError) as info:
        p.decode_server(json.dumps(obj).encode())
    assert info.value.code is ErrorCode.BAD_MESSAGE and named in info.value.message


def test_a_granted_without_request_reads_as_before() -> None:
    line = b'{"op":"granted","req":1,"id":3,"gpus":[0],"units":5}'
    assert p.decode_server(line) == p.Granted(1, 3, (0,), 5)
    assert p.encode(p.Granted(1, 3, (0,), 5)) == line + b"\n"


@pytest.mark.parametrize(
    "line",
    [
        '{"op":"bye","req":7}'.encode("utf-16-le"),
        '{"op":"bye","req":7}'.encode("utf-16"),  # with its byte order mark
        b'\xef\xbb\xbf{"op":"bye","req":7}',  # UTF-8 with a byte order mark
        b' {"op":"bye","req":7} ',
    ],
)
def test_lines_are_read_as_json_loads_reads_bytes(line: bytes) -> None:
    """The common line (starting ``{``) is decoded straight as UTF-8; any other goes through
    ``json.loads``, which guesses the encoding from the first bytes, as before."""
    assert p.decode_client(line) == p.Bye(7)


def test_a_surrogate_encoded_in_utf8_bytes_reads_as_json_loads_reads_it() -> None:
    line = '{"op":"acquire","req":1,"count":1,"units":5,"wait":true,"name":"a\ud800"}'
    raw = line.encode("utf-8", "surrogatepass")
    with pytest.raises(ProtocolError, match="name holds a lone surrogate"):
        p.decode_client(raw)
    assert json.loads(raw)["name"] == "a\ud800"
