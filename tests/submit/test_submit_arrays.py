"""``hwpool submit --array`` end to end: real supervisor, launchers and server; each member
sees its index; ``%K`` bounds how many run at once; the array's id works for the commands."""

from __future__ import annotations

import json
import sys

from hwpool._jobs._model import JobState
from jobbox import Box

# A member: writes m<INDEX>.started (the files there then, its array variables), waits for
# m<INDEX>.go (bounded), writes m<INDEX>.done.
MEMBER = """
import json, os, sys, time
index = os.environ["HWPOOL_ARRAY_INDEX"]
seen = sorted(os.listdir("."))
env = os.environ
record = {"seen": seen, "array": env["HWPOOL_ARRAY_ID"], "job": env["HWPOOL_JOB_ID"]}
json.dump(record, open(f"m{index}.tmp", "w"))
os.rename(f"m{index}.tmp", f"m{index}.started")
deadline = time.monotonic() + 30
while not os.path.exists(f"m{index}.go") and time.monotonic() < deadline:
    time.sleep(0.01)
open(f"m{index}.done", "w").close()
"""


def test_members_run_with_their_index_at_most_k_at_once(box: Box) -> None:
    done = box.hwpool(
        "submit", "--gpus", "0.25", "--array", "0-3%2", "--cwd", str(box.work), "--",
        sys.executable, "-c", MEMBER,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    array = done.stdout.strip()
    members = [f"{array}_{index}" for index in range(4)]
    box.running(members[0])
    box.running(members[1])
    for index in range(4):  # let each go in turn; a later one starts only when one ended
        box.file(f"m{index}.go").touch()
        box.finished(members[index])
    for index in range(4):
        started = json.loads(box.file(f"m{index}.started").read_text())
        assert (started["array"], started["job"]) == (array, members[index])
        running = {f for f in started["seen"] if f.endswith(".started")}
        ended = {f.replace(".done", ".started") for f in started["seen"] if f.endswith(".done")}
        assert len(running - ended) <= 1, (index, started["seen"])  # at most 2 with itself
    listed = json.loads(box.hwpool("jobs", array, "--json").stdout)
    assert sorted(job["id"] for job in listed) == members
    assert {job["array_index"] for job in listed} == {0, 1, 2, 3}


def test_the_array_id_cancels_and_holds_every_member(box: Box) -> None:
    blocker = box.submit(job=["a", "wait=a.go"])
    box.running(blocker)
    done = box.hwpool("submit", "--array", "1,3,7", "--", "true")
    array = done.stdout.strip()
    held = box.hwpool("hold", array)
    assert held.returncode == 0, held.stderr
    assert held.stdout.count(": held") == 3
    assert all(box.job(f"{array}_{i}").held for i in (1, 3, 7))
    released = box.hwpool("release", f"{array}_3")
    assert released.stdout == f"{array}_3: released\n"
    cancelled = box.hwpool("cancel", array)
    assert cancelled.returncode == 0, cancelled.stderr
    assert {box.job(f"{array}_{i}").state for i in (1, 3, 7)} == {JobState.CANCELLED}
    logs = box.hwpool("logs", array)
    assert logs.returncode == 2 and f"{array} is an array of 3 jobs" in logs.stderr
    box.file("a.go").touch()
    box.finished(blocker)
