"""A hypothesis state machine over the job table's transitions, against a small dict model.

Every rule is tried on any job, in any state (and on ids that do not exist): the model says
whether the table must accept it and what follows, or refuse it and change nothing.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule
from jobtables import dump

from hwpool._jobs._model import FINISHED, JobState
from hwpool._jobs._store import JobStateError, JobStore, UnknownJobError

ENDS = {
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled",
    JobState.TIMED_OUT: "timed out",
    JobState.LOST: "was lost",
}


@dataclass
class Model:
    """What the table should hold about one job."""

    state: JobState
    after: list[int]
    reason: str | None = None
    ended_at: float | None = None
    retry_of: int | None = None
    code: int | None = None  # a failed job's exit code
    extra: dict[str, object] = field(default_factory=dict)


class JobTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="hwpool-jobs-"))
        self.store = JobStore.open(self.directory / "state")
        self.jobs: dict[int, Model] = {}
        self.next_number = 1
        self.clock = 1_800_000_000.0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def tick(self) -> float:
        self.clock += 1
        return self.clock

    # ------------------------------------------------------------- the model's rules
    def refusal(self, after: list[int]) -> str | None:
        """Why ``add`` with ``after`` must be refused, or None."""
        for number in after:
            if number not in self.jobs:
                return f"after: no job 'j{number}'"
            if self.jobs[number].state in ENDS:
                return f"after: dependency 'j{number}' {ENDS[self.jobs[number].state]}"
        return None

    def added(self, after: list[int], retry_of: int | None = None) -> int:
        ok = all(self.jobs[n].state is JobState.SUCCEEDED for n in after)
        number = self.next_number
        self.jobs[number] = Model(JobState.QUEUED if ok else JobState.WAITING, after)
        self.jobs[number].retry_of = retry_of
        self.next_number += 1
        return number

    def expect_refusal(self, call: object, error: type[Exception], fragment: str) -> None:
        before = dump(self.store.path)
        try:
            call()  # type: ignore[operator]
        except error as exc:
            assert fragment in str(exc), (fragment, str(exc))
        else:
            raise AssertionError(f"expected {error.__name__}: {fragment}")
        assert dump(self.store.path) == before

    def transition(self, number: int, action: str, allowed: set[JobState], call: object) -> bool:
        """Run ``call`` (the transition ``action`` on job ``number``) and check that it was
        accepted exactly when the model allows it; whether it was."""
        job_id = f"j{number}"
        if number not in self.jobs:
            self.expect_refusal(call, UnknownJobError, f"no job {job_id!r}")
            return False
        state = self.jobs[number].state
        if state not in allowed:
            self.expect_refusal(call, JobStateError, f"job_id {job_id!r} is {state.value}")
            return False
        call()  # type: ignore[operator]
        return True

    # ------------------------------------------------------------- rules
    jobs = Bundle("jobs")
    # mostly jobs that were added (pruned ones included), sometimes an id never given
    numbers = st.one_of(jobs, jobs, jobs, st.integers(min_value=1, max_value=40))

    @rule(target=jobs, after=st.lists(jobs, max_size=3) | st.lists(numbers, max_size=2))
    def add(self, after: list[int]) -> object:
        unique = list(dict.fromkeys(after))
        ids = [f"j{n}" for n in after]
        why = self.refusal(unique)
        call = lambda: self.store.add(["run"], cwd="/", environment={}, after=ids, now=self.clock)  # noqa: E731
        if why is not None:
            self.expect_refusal(call, ValueError, why)
            return multiple()
        job = call()
        assert job.id == f"j{self.added(unique)}"
        return job.number

    @rule(target=jobs)
    def add_after_the_newest(self) -> object:
        """Chains (j3 after j2 after j1) are where dependency resolution is hard."""
        return self.add([max(self.jobs)] if self.jobs else [])

    @rule(number=numbers)
    def mark_running(self, number: int) -> None:
        call = lambda: self.store.mark_running(f"j{number}", pid=7, pid_start=1, now=self.tick())  # noqa: E731
        if self.transition(number, "mark_running", {JobState.QUEUED}, call):
            self.jobs[number].state = JobState.RUNNING

    @rule(number=numbers, code=st.integers(min_value=0, max_value=2))
    def mark_finished(self, number: int, code: int) -> None:
        now = self.tick()
        call = lambda: self.store.mark_finished(f"j{number}", exit_code=code, now=now)  # noqa: E731
        if self.transition(number, "mark_finished", {JobState.RUNNING}, call):
            job = self.jobs[number]
            job.state, job.ended_at = (JobState.FAILED if code else JobState.SUCCEEDED), now
            job.code = code

    @rule(number=numbers)
    def mark_cancelled(self, number: int) -> None:
        now = self.tick()
        call = lambda: self.store.mark_cancelled(f"j{number}", now=now)  # noqa: E731
        allowed = {JobState.QUEUED, JobState.WAITING, JobState.RUNNING}
        if self.transition(number, "mark_cancelled", allowed, call):
            job = self.jobs[number]
            job.state, job.ended_at, job.reason = JobState.CANCELLED, now, "cancelled by its user"

    @rule(number=numbers, lost=st.booleans())
    def mark_timed_out_or_lost(self, number: int, lost: bool) -> None:
        now = self.tick()
        job_id = f"j{number}"
        if lost:
            call = lambda: self.store.mark_lost(job_id, reason="found dead", now=now)  # noqa: E731
        else:
            call = lambda: self.store.mark_timed_out(job_id, now=now)  # noqa: E731
        action = "mark_lost" if lost else "mark_timed_out"
        if self.transition(number, action, {JobState.RUNNING}, call):
            job = self.jobs[number]
            job.state = JobState.LOST if lost else JobState.TIMED_OUT
            job.ended_at, job.reason = now, "found dead" if lost else "ran past its time limit"

    @rule(target=jobs, number=numbers)
    def retry(self, number: int) -> object:
        call = lambda: self.store.retry(f"j{number}", now=self.clock)  # noqa: E731
        if number in self.jobs and self.jobs[number].state in FINISHED:
            standing = [self.may_succeed(after) for after in self.jobs[number].after]
            for after, stand_in in zip(self.jobs[number].after, standing, strict=True):
                if stand_in is None:
                    self.expect_refusal(call, JobStateError, f"its dependency j{after} ")
                    return multiple()
            chosen = [n for n in dict.fromkeys(standing) if n is not None]
            again = self.added(chosen, retry_of=number)
            assert call().id == f"j{again}"
            return again
        self.transition(number, "retry", set(FINISHED), call)
        return multiple()

    def may_succeed(self, number: int) -> int | None:
        """What a retry waits for in place of dependency ``number``: itself while it may
        still succeed, else its newest retry (followed down) that may; None: none may."""
        if number in self.jobs and self.jobs[number].state not in ENDS:
            return number
        retries = [n for n, job in self.jobs.items() if job.retry_of == number]
        retries.sort(reverse=True)
        for retry in retries:
            found = self.may_succeed(retry)
            if found is not None:
                return found
        return None

    @rule()
    def ready(self) -> None:
        now = self.tick()
        for number in sorted(self.jobs):
            job = self.jobs[number]
            if job.state is JobState.WAITING:
                self.settle(job, now)
        expected = [f"j{n}" for n in sorted(self.jobs) if self.jobs[n].state is JobState.QUEUED]
        assert [job.id for job in self.store.ready(now=now)] == expected

    def settle(self, job: Model, now: float) -> None:
        for after in job.after:
            dependency = self.jobs.get(after)
            end = "was pruned" if dependency is None else ENDS.get(dependency.state)
            if end is not None:
                how = ""
                if dependency is not None and dependency.state is JobState.FAILED:
                    how = f" (exit {dependency.code})"
                job.state, job.reason, job.ended_at = (
                    JobState.CANCELLED,
                    f"dependency j{after} {end}{how}",
                    now,
                )
                return
        if all(self.jobs[after].state is JobState.SUCCEEDED for after in job.after):
            job.state = JobState.QUEUED

    @rule(keep_count=st.integers(min_value=0, max_value=4), keep=st.integers(0, 6))
    def prune(self, keep_count: int, keep: int) -> None:
        now = self.tick()
        needed = {a for j in self.jobs.values() if j.state not in FINISHED for a in j.after}
        finished = [n for n, j in self.jobs.items() if j.state in FINISHED]
        newest = sorted(finished, key=lambda n: (self.jobs[n].ended_at, n), reverse=True)
        kept = set(newest[:keep_count])
        doomed = {
            n for n in finished
            if (self.jobs[n].ended_at or 0) < now - keep or n not in kept
        } - needed  # fmt: skip
        gone = self.store.prune(now=now, keep_seconds=keep, keep_count=keep_count)
        assert sorted(job.number for job in gone) == sorted(doomed)
        for number in doomed:
            del self.jobs[number]

    # ------------------------------------------------------------- invariants
    @invariant()
    def the_table_matches_the_model(self) -> None:
        listed = {job.number: job for job in self.store.list(include_finished=True)}
        assert sorted(listed) == sorted(self.jobs)
        for number, job in listed.items():
            model = self.jobs[number]
            assert (job.state, job.reason, job.ended_at) == (
                model.state, model.reason, model.ended_at,
            ), job.id  # fmt: skip
            assert job.after == tuple(f"j{a}" for a in model.after)
            assert job.retry_of == (None if model.retry_of is None else f"j{model.retry_of}")
        unfinished = {job.number for job in self.store.list()}
        assert unfinished == {n for n, j in self.jobs.items() if j.state not in FINISHED}


JobTableMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestJobTable = JobTableMachine.TestCase
