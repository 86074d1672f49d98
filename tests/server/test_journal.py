"""The journal file: an append-only log of changes, replayed on load, compacted on a thread.

What a crash can leave (a last line cut short) loads as the state before that append; what
nothing of ours can leave (a bad line in the middle, an empty file, ids past the limit) is a
JournalError. A change costs one line, however long the queue.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_host_state import acquire, client, host

from hostserver import BOUND
from hwpool._core._capacity import UNITS_PER_GPU
from hwpool._server import _journal
from hwpool._server._journal import Counters, Journal, JournalEntry, JournalError, JournalFile
from hwpool._wire import _protocol as p

FULL = 1000


def lease(ident: int, pid: int = 11, gpu: int = 0) -> JournalEntry:
    return JournalEntry(ident, 0, pid, 1, FULL, ((gpu, FULL),), token="t")


def waiter(ident: int, pid: int = 12) -> JournalEntry:
    return JournalEntry(ident, 0, pid, 1, FULL)


def opened(tmp_path: Path, journal: Journal | None = None) -> JournalFile:
    path = tmp_path / "s.sock.journal"
    return JournalFile(path, tmp_path / "s.sock.ids", 4242, journal or Journal(1))


def test_changes_are_appended_and_replayed(tmp_path: Path) -> None:
    file = opened(tmp_path)
    file.write(1025, {1: waiter(1), 2: waiter(2)}, Counters())
    file.write(1025, {1: lease(1)}, Counters(granted=1))
    file.write(1025, {2: None, 3: waiter(3)}, Counters(granted=1, cancelled=1))
    loaded = _journal.load(file.path)
    assert loaded == Journal(1025, (lease(1), waiter(3)), Counters(1, 0, 1, 0))
    assert loaded == file.journal()
    ops = [json.loads(line)["op"] for line in file.path.read_text().splitlines()[1:]]
    assert ops[2:] == [
        "ids", "queued", "queued", "granted", "counters", "withdrawn", "queued", "counters",
    ]  # fmt: skip
    assert _journal.load_ids(file.ids) == 1025


def test_each_change_costs_one_line_however_long_the_queue(tmp_path: Path) -> None:
    file = opened(tmp_path)
    sizes = []
    for ident in range(1, 3001):
        before = file.path.stat().st_size if file.path.exists() else 0
        file.write(4000, {ident: waiter(ident)}, Counters())
        sizes.append(file.path.stat().st_size - before)
    assert max(sizes[100:]) < 150  # one record, never the whole queue again
    assert len(_journal.load(file.path).entries) == 3000  # type: ignore[union-attr]


def test_a_last_line_cut_short_is_ignored(tmp_path: Path) -> None:
    file = opened(tmp_path)
    file.write(1025, {1: lease(1)}, Counters(granted=1))
    whole = file.path.read_bytes()
    file.write(1025, {1: None, 2: lease(2)}, Counters(granted=2, released=1))
    file.close()
    data = file.path.read_bytes()
    for cut in range(len(whole), len(data)):  # a crash anywhere in the second append
        file.path.write_bytes(data[:cut])
        loaded = _journal.load(file.path)
        assert loaded is not None and {e.id for e in loaded.entries} <= {1, 2}
    file.path.write_bytes(data[: len(whole)])
    assert _journal.load(file.path) == Journal(1025, (lease(1),), Counters(granted=1))


GRANTED_WITHOUT_HELD = b'{"op":"granted","id":1,"uid":0,"pid":1,"count":1,"units":5,"held":null}'
PAST_THE_LIMIT = b'{"op":"queued","id":99999,"uid":0,"pid":1,"count":1,"units":5,"held":null}'
Damage = Callable[[list[bytes]], list[bytes]]
DAMAGES: list[tuple[Damage, str]] = [
    (lambda lines: [lines[0], b"{not json", *lines[1:]], "line 2"),
    (lambda lines: [*lines, b'{"op":"teleported","id":1}'], "unknown record"),
    (lambda lines: [*lines, GRANTED_WITHOUT_HELD], "held"),
    (lambda lines: [*lines, b'"a string"'], "must be an object"),
    (lambda lines: [lines[0], *lines[2:], PAST_THE_LIMIT], "id limit"),
    (lambda lines: [b'{"format":"other","version":2}', *lines[1:]], "not an hwpool journal"),
    (lambda lines: [b'{"format":"hwpool-journal","version":3}', *lines[1:]], "version 3"),
    (lambda lines: [b""], "not valid"),
]


@pytest.mark.parametrize(("damage", "match"), DAMAGES)
def test_anything_else_corrupt_is_a_journal_error(
    tmp_path: Path, damage: Damage, match: str
) -> None:
    file = opened(tmp_path)
    file.write(1025, {1: lease(1)}, Counters(granted=1))
    file.close()
    lines = file.path.read_bytes().split(b"\n")[:-1]
    file.path.write_bytes(b"\n".join(damage(lines)) + b"\n")
    with pytest.raises(JournalError, match=match):
        _journal.load(file.path)


def test_an_empty_or_headless_file_is_a_journal_error(tmp_path: Path) -> None:
    path = tmp_path / "j"
    for data in (b"", b'{"format":"hwpool-jou'):
        path.write_bytes(data)
        with pytest.raises(JournalError, match="not valid"):
            _journal.load(path)


def test_a_journal_of_version_1_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "j"
    entry = {"id": 3, "uid": 0, "pid": 9, "count": 1, "units": FULL, "held": [[1, FULL]]}
    old = {"format": "hwpool-journal", "version": 1, "server_pid": 1, "id_limit": 1025,
           "entries": [entry]}  # fmt: skip
    path.write_text(json.dumps(old))
    assert _journal.load(path) == Journal(1025, (JournalEntry(3, 0, 9, 1, FULL, ((1, FULL),)),))


def test_a_failed_append_is_cut_off_and_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = opened(tmp_path)
    file.write(1025, {1: lease(1)}, Counters(granted=1))
    real = _journal._write_all

    def half_then_full(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_journal, "_write_all", half_then_full)
    with pytest.raises(OSError, match="No space"):
        file.write(1025, {2: waiter(2)}, Counters(granted=1))
    assert _journal.load(file.path) == Journal(1025, (lease(1),), Counters(granted=1))
    monkeypatch.setattr(_journal, "_write_all", real)
    file.write(1025, {2: waiter(2), 3: waiter(3)}, Counters(granted=1))
    loaded = _journal.load(file.path)
    assert loaded == Journal(1025, (lease(1), waiter(2), waiter(3)), Counters(granted=1))


def test_the_log_is_compacted_and_stays_within_its_ratio(tmp_path: Path) -> None:
    file = opened(tmp_path)
    file.write(1025, {1: lease(1), 2: waiter(2)}, Counters())
    # Held open, the first file keeps its inode: a later snapshot cannot be given that number
    # again (compared by number alone, it could: the test failed 1 run in 3 under load).
    first = os.open(file.path, os.O_RDONLY)
    try:
        for n in range(6000):  # churn on one lease: the live state stays two or three entries
            file.write(1025, {3: lease(3) if n % 2 == 0 else None}, Counters(granted=n))
        file.close()
        assert os.fstat(first).st_nlink == 0  # replaced by a snapshot: unlinked
        assert file.path.stat().st_ino != os.fstat(first).st_ino
    finally:
        os.close(first)
    assert len(file.path.read_bytes().splitlines()) < 3000  # not 12,000 lines of churn
    assert _journal.load(file.path) == Journal(1025, (lease(1), waiter(2)), Counters(granted=5999))


def test_a_compaction_keeps_what_was_appended_while_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go_on = threading.Event()
    real = _journal._create

    def held_back(path: Path) -> int:  # the snapshot thread waits until told to go on
        if threading.current_thread().name == "hwpool-compact":
            assert go_on.wait(BOUND)
        return real(path)

    monkeypatch.setattr(_journal, "_create", held_back)
    file = opened(tmp_path)
    for ident in range(1, 1200):
        file.write(2049, {ident: waiter(ident)}, Counters())
    ident = 0
    while file.compaction is None:  # over 4 lines per live entry and the slack: it starts
        ident += 1
        file.write(2049, {ident: None}, Counters())
    job = file.compaction
    for more in range(1200, 1210):  # appended while the snapshot is being written
        file.write(2049, {more: waiter(more)}, Counters())
    assert file.compaction is job and len(job.tail) == 10
    go_on.set()
    job.thread.join(BOUND)
    file.write(2049, {1210: waiter(1210)}, Counters())  # the swap, then this append
    assert file.compaction is None
    expected = set(range(ident + 1, 1211))
    loaded = _journal.load(file.path)
    assert loaded is not None and {e.id for e in loaded.entries} == expected
    assert len(file.path.read_bytes().splitlines()) == 3 + len(expected)  # snapshot, tail, last


def test_the_id_file_is_kept_apart_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "ids"
    assert _journal.load_ids(path) is None
    _journal.save_ids(path, 2049)
    assert _journal.load_ids(path) == 2049
    for bad in (b"", b"-5\n", b"2049x\n", str(2**60).encode()):
        path.write_bytes(bad)
        with pytest.raises(JournalError, match="id file"):
            _journal.load_ids(path)


def test_side_files_are_never_written_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep")
    file = opened(tmp_path)
    (tmp_path / "s.sock.journal.tmp").symlink_to(target)
    file.write(1025, {1: lease(1)}, Counters())  # the planted link is removed, not followed
    assert target.read_text() == "keep"
    assert _journal.load(file.path) is not None


def test_the_state_hands_over_what_changed_since_it_was_last_asked() -> None:
    state = host(1)
    a, b = client(pid=1), client(pid=2, number=2)
    acquire(state, a, 1)  # id 1, granted
    acquire(state, b, 1)  # id 2, waits
    assert state.journal_changes() == {
        1: JournalEntry(1, 1000, 1, 1, UNITS_PER_GPU, ((0, UNITS_PER_GPU),), start=0.0),
        2: JournalEntry(2, 1000, 2, 1, UNITS_PER_GPU),
    }
    assert state.journal_changes() == {}
    state.release(a, p.Release(9, 1), 1.0)  # 1 goes, 2 is granted
    assert state.journal_changes() == {
        1: None,
        2: JournalEntry(2, 1000, 2, 1, UNITS_PER_GPU, ((0, UNITS_PER_GPU),), start=1.0),
    }
    assert state.counters() == Counters(granted=2, released=1)
    assert state.journal().counters == state.counters()


def test_a_leases_time_limit_end_is_journaled_and_replayed(tmp_path: Path) -> None:
    file = opened(tmp_path)
    limited = JournalEntry(1, 0, 11, 1, FULL, ((0, FULL),), "t", limit_end=12345.25)
    file.write(1025, {1: limited, 2: waiter(2)}, Counters())
    assert _journal.load(file.path) == Journal(1025, (limited, waiter(2)), Counters())
    records = [json.loads(line) for line in file.path.read_text().splitlines()[1:]]
    by_id = {r["id"]: r for r in records if r["op"] in ("granted", "queued")}
    assert by_id[1]["limit_end"] == 12345.25 and "limit_end" not in by_id[2]


def test_a_leases_start_is_journaled_and_replayed(tmp_path: Path) -> None:
    file = opened(tmp_path)
    started = JournalEntry(1, 0, 11, 1, FULL, ((0, FULL),), "t", start=81200.25)
    file.write(1025, {1: started, 2: waiter(2)}, Counters())
    assert _journal.load(file.path) == Journal(1025, (started, waiter(2)), Counters())
    text = file.path.read_text()
    assert '"start":81200.25' in text
    file.path.write_text(text.replace("81200.25", '"then"'))
    with pytest.raises(JournalError, match="start"):
        _journal.load(file.path)


def test_a_bad_limit_end_is_a_journal_error(tmp_path: Path) -> None:
    file = opened(tmp_path)
    file.write(1025, {1: lease(1)}, Counters())
    text = file.path.read_text().replace('"token":"t"', '"token":"t","limit_end":"soon"')
    file.path.write_text(text)
    with pytest.raises(JournalError, match="limit_end"):
        _journal.load(file.path)
