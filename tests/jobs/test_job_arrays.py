"""Job arrays in the table: the spec as Slurm writes it, members with their own rows and one
array id, dependencies on an array, ids of members; bad input refused, adding nothing."""

from __future__ import annotations

import pytest
from jobtables import add, dump

from hwpool._jobs._arrays import MAX_ARRAY_SIZE, ArraySpec, parse_array_spec
from hwpool._jobs._model import JobState
from hwpool._jobs._store import JobStore, UnknownJobError


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("1,3,7", (1, 3, 7), None),
        ("0-20:10", (0, 10, 20), None),
        ("0-99:50%1", (0, 50), 1),
        ("5,1-2,5", (1, 2, 5), None),
        ("7", (7,), None),
        ("0-3%4", (0, 1, 2, 3), 4),
    ],
)
def test_specs_read_as_slurm_reads_them(
    text: str, indices: tuple[int, ...], limit: int | None
) -> None:
    assert parse_array_spec(text) == ArraySpec(indices, limit)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "got ''"),
        ("3-1", "must run upwards"),
        ("0-9:0", "step >= 1"),
        ("0-5%0", "%K must be an integer >= 1"),
        ("0-5%x", "%K"),
        ("a-b", "got 'a-b'"),
        ("-1", "got '-1'"),
        ("0-2000000", "at most 1000000"),
        (f"0-{MAX_ARRAY_SIZE}", f"more than {MAX_ARRAY_SIZE} members"),
    ],
)
def test_bad_specs_are_refused_naming_the_option(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="--array") as caught:
        parse_array_spec(text)
    assert fragment in str(caught.value)


def test_an_array_is_one_transaction_of_members_sharing_the_first_number(store: JobStore) -> None:
    before = add(store)
    members = store.add_all([(("python", "sweep.py"), None)], cwd="/srv", environment={},
                            array=parse_array_spec("0-4:2%2"))  # fmt: skip
    assert [job.id for job in members] == ["j2_0", "j2_2", "j2_4"]
    assert [job.number for job in members] == [2, 3, 4]
    assert {job.array_id for job in members} == {"j2"} and members[1].array_limit == 2
    assert store.members("j2") == ["j2_0", "j2_2", "j2_4"]
    assert store.members(before.id) == [before.id]
    assert store.get("j2_2").number == 3 and store.get("j3").id == "j2_2"
    after = add(store, after=["j2"])
    assert after.after == ("j2_0", "j2_2", "j2_4")  # an array's id: every member
    with pytest.raises(UnknownJobError, match="no job 'j2_1'"):
        store.get("j2_1")


def test_a_retried_member_keeps_its_index_and_its_id_names_the_newest_run(store: JobStore) -> None:
    (member,) = store.add_all([(("true",), None)], cwd="/srv", environment={},
                              array=ArraySpec((5,), None))  # fmt: skip
    store.mark_running(member.id, pid=1, pid_start=1)
    store.mark_finished(member.id, exit_code=1)
    again = store.retry(member.id)
    assert (again.id, again.array_index, again.retry_of) == (member.id, 5, f"j{member.number}")
    assert store.get(member.id).number == again.number and again.state is JobState.QUEUED


def test_a_bad_array_adds_nothing(store: JobStore) -> None:
    before = dump(store.path)
    with pytest.raises(ValueError, match="array: one command"):
        store.add_all([(("a",), None), (("b",), None)], cwd="/srv", environment={},
                      array=ArraySpec((0, 1), None))  # fmt: skip
    with pytest.raises(ValueError, match="after: no job 'j9_1'"):
        store.add_all([(("a",), None)], cwd="/srv", environment={}, after=["j9_1"],
                      array=ArraySpec((0, 1), None))  # fmt: skip
    assert dump(store.path) == before
