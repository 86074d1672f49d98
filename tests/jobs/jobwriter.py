"""A process that writes the job table, for the crash and concurrency tests.

``python jobwriter.py DIR stream``: writes forever (adds with 0 to 2 dependencies, runs,
finishes, retries, resolves, cancels), printing the number of transactions done after each;
the test kills it with SIGKILL at some point in the middle.
``python jobwriter.py DIR stall``: adds one job with two dependencies, and inside that
transaction, after the dependency rows, prints ``inside`` and waits to be killed.
``python jobwriter.py DIR add N``: adds N jobs, printing each id, then exits.
Each job's name says how many dependencies it was given (``deps2``), for the checks.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from hwpool._jobs._store import JobStore

ENV = {"PATH": "/usr/bin", "TOKEN": "secret"}


def add(store: JobStore, after: Sequence[str]) -> str:
    return store.add(["step"], cwd="/", environment=ENV, name=f"deps{len(after)}", after=after).id


def stream(store: JobStore) -> None:
    """Transactions of every kind, forever."""
    done = 0
    may_succeed = ["queued", "waiting-on-dependency", "running", "succeeded"]
    for round_ in range(10**9):
        earlier = [job.id for job in store.list(states=may_succeed)[:2]]
        job = add(store, earlier[: round_ % 3])
        for ready in store.ready():
            store.mark_running(ready.id, pid=1000 + round_, pid_start=round_)
            store.mark_finished(ready.id, exit_code=round_ % 2)
            done += 2
        failed = store.list(states=["failed", "cancelled"])[:1]
        if round_ % 5 == 0 and failed:
            store.retry(failed[0].id)
            done += 1
        if store.get(job).state.value == "waiting-on-dependency":
            store.mark_cancelled(job)
            done += 1
        done += 2
        print(done, flush=True)


class StallingStore(JobStore):
    """Stops inside the add's transaction, once the dependency rows are written."""

    def _insert_dependencies(self, number: int, dependencies: Sequence[int]) -> None:
        super()._insert_dependencies(number, dependencies)
        print("inside", flush=True)
        threading.Event().wait()


def main(argv: list[str]) -> None:
    directory, mode = Path(argv[0]), argv[1]
    if mode == "stall":
        with StallingStore.open(directory) as store:
            add(store, ["j1", "j2"])
    with JobStore.open(directory) as store:
        if mode == "stream":
            stream(store)
        for _ in range(int(argv[2]) if mode == "add" else 0):
            print(add(store, []), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
