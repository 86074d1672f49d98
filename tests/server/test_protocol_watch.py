"""The protocol's part of the GPU watch: ``notice``, ``revoked`` for overuse, the hello's
``notices`` and the status fields (docs/observability.md), each optional both ways."""

from __future__ import annotations

import json

import pytest

from hwpool._wire import _protocol as p

WATCH = p.WatchRecord("nvml", 2.0, 0.5, "")
GPU = p.GPUStateRecord(0, "GPU-1", 16384, 9000, 37, 4000)
OUTSIDE = p.OutsideRecord(4242, 1000, "alice", 0, 4000)
LEASE = p.LeaseRecord(7, 1000, 99, ((0, 2048),), 1.5, watched=True, used_mib=5000,
                      over_lease=True, allowed_mib=2048)  # fmt: skip


def _status(**fields: object) -> p.StatusReply:
    return p.StatusReply(3, (0,), (LEASE,), (), 1, 0, 0, 0, 0.0, 9.0, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [True, False])
def test_the_watch_fields_of_a_status_come_back_as_sent(stream: bool) -> None:
    reply = _status(watch=WATCH, gpu_state=(GPU,), outside=(OUTSIDE,), outside_left_out=2,
                    ended_for_overuse=1)  # fmt: skip
    *parts, last = [p.decode_server(line) for line in p.status_lines(reply, stream)]
    assert isinstance(last, p.StatusReply)
    assert p.join_status(parts, last) == reply  # type: ignore[arg-type]


def test_a_status_without_the_watch_has_none_of_its_fields() -> None:
    lease = p.LeaseRecord(7, 1000, 99, ((0, 2048),), 1.5)
    reply = p.StatusReply(3, (0,), (lease,), (), 1, 0, 0, 0, 0.0, 9.0)
    wire = json.loads(p.encode(reply))
    for key in ("watch", "gpu_state", "outside", "outside_left_out", "ended_for_overuse"):
        assert key not in wire
    assert set(wire["leases"][0]) == {"id", "uid", "pid", "held", "age_s"}
    assert p.decode_server(p.encode(reply)) == reply


def test_unknown_values_are_null_and_the_first_sample_has_no_age() -> None:
    reply = _status(watch=p.WatchRecord("", 2.0, None, ""),
                    gpu_state=(p.GPUStateRecord(0, "GPU-1", None, None, None, 0),),
                    outside=(p.OutsideRecord(5, None, "", 0, None),))  # fmt: skip
    wire = json.loads(p.encode(reply))
    assert wire["watch"]["age_s"] is None and wire["gpu_state"][0]["used_mib"] is None
    assert p.decode_server(p.encode(reply)) == reply


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda w: w["gpu_state"][0].update(utilization=101), "utilization"),
        (lambda w: w["gpu_state"][0].update(withheld_mib=-1), "withheld_mib"),
        (lambda w: w["outside"][0].update(pid="x"), "pid"),
        (lambda w: w.update(watch=[]), "watch"),
        (lambda w: w["watch"].update(interval_s=-1), "interval_s"),
    ],
)
def test_a_bad_watch_field_is_refused_naming_it(change: object, named: str) -> None:
    wire = json.loads(p.encode(_status(watch=WATCH, gpu_state=(GPU,), outside=(OUTSIDE,))))
    change(wire)  # type: ignore[operator]
    with pytest.raises(p.ProtocolError, match=named):
        p.decode_server(json.dumps(wire).encode() + b"\n")


def test_a_notice_comes_back_as_sent_and_is_cut_to_the_text_limit() -> None:
    notice = p.Notice(4, 7, "hwpool: lease #7 uses 5000 MiB of GPU 0, more than its 2048 MiB")
    assert p.decode_server(p.encode(notice)) == notice
    long = p.decode_server(p.encode(p.Notice(4, 7, "x" * (p.MAX_TEXT + 10))))
    assert isinstance(long, p.Notice) and len(long.text) == p.MAX_TEXT


def test_revoked_for_overuse_comes_back_and_an_unknown_reason_reads_as_cancel() -> None:
    revoked = p.Revoked(4, 7, 0, "overuse")
    assert json.loads(p.encode(revoked))["reason"] == "overuse"
    assert p.decode_server(p.encode(revoked)) == revoked
    later = b'{"op": "revoked", "req": 4, "id": 7, "by": 0, "reason": "later"}\n'
    assert p.decode_server(later) == p.Revoked(4, 7, 0, "cancel")


def test_a_hello_says_notices_only_when_it_reads_them() -> None:
    hello = p.Hello(1, "new", None, "data", notices=True)
    assert json.loads(p.encode(hello))["notices"] is True
    assert p.decode_client(p.encode(hello)) == hello
    assert "notices" not in json.loads(p.encode(p.Hello(1, "old")))
    with pytest.raises(p.ProtocolError, match="notices"):
        p.decode_client(b'{"op": "hello", "version": 1, "client": "x", "notices": 1}\n')
