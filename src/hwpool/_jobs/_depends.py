"""Dependency kinds and the one verdict on a job's dependencies, as Slurm's ``--dependency``
reads them: pure (the store passes the dependencies' states in).

- ``ok`` (``--after``): every one succeeded. One that ended otherwise can never be met.
- ``any`` (``--after-any``): every one ended, however (a pruned job had ended).
- ``notok`` (``--after-notok``, for clean-up and alerts): at least one of them ended without
  success (failed, cancelled, timed out or lost). It can never be met once all of them
  succeeded (a pruned one counts as unknown, so as not failed).

A job is ready when all its dependencies are met; it waits while one may still be; it is
cancelled, with the reason of the first in the order given that can never be met, otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

from ._model import JobState, format_job_id, how_ended

__all__ = ["DEPENDENCY_ENDS", "Dependency", "DependencyKind", "Verdict", "verdict"]

DEPENDENCY_ENDS = {
    JobState.FAILED: "failed",
    JobState.CANCELLED: "was cancelled",
    JobState.TIMED_OUT: "timed out",
    JobState.LOST: "was lost",
}
"""The ends that are not success, as a reason says them (``dependency j3 failed (exit 1)``)."""


class DependencyKind(StrEnum):
    """What a dependency waits for (the values are the table's, and ``--after-KIND``'s)."""

    OK = "ok"
    ANY = "any"
    NOTOK = "notok"


class Dependency(NamedTuple):
    """One dependency as the table has it: ``state`` None when the job was pruned."""

    number: int
    kind: DependencyKind
    state: JobState | None
    exit_code: int | None
    signal: int | None


class Verdict(NamedTuple):
    """``ready``: every dependency met; else ``never`` (a reason) or neither (it waits)."""

    ready: bool
    never: str | None = None


_READY = Verdict(True)
_WAITS = Verdict(False)


def verdict(dependencies: Sequence[Dependency]) -> Verdict:
    """Whether a job with ``dependencies`` (in the order given) may run, waits, or never will."""
    met = True
    notok = [dep for dep in dependencies if dep.kind is DependencyKind.NOTOK]
    notok_met = any(dep.state in DEPENDENCY_ENDS for dep in notok)
    notok_never = bool(notok) and not notok_met and all(_ended(dep) for dep in notok)
    for dep in dependencies:
        if dep.kind is DependencyKind.OK:
            if dep.state is None or dep.state in DEPENDENCY_ENDS:
                return Verdict(False, _ended_reason(dep))
            met = met and dep.state is JobState.SUCCEEDED
        elif dep.kind is DependencyKind.ANY:
            met = met and _ended(dep)
        elif notok_never:
            return Verdict(False, _ended_reason(dep) + " (--after-notok needs one to fail)")
        else:
            met = met and notok_met
    return _READY if met else _WAITS


def _ended(dep: Dependency) -> bool:
    return dep.state is None or dep.state.finished


def _ended_reason(dep: Dependency) -> str:
    job_id = format_job_id(dep.number)
    if dep.state is None:
        return f"dependency {job_id} was pruned"
    if dep.state is JobState.SUCCEEDED:
        return f"dependency {job_id} succeeded"
    how = how_ended(dep.exit_code, dep.signal) if dep.state is JobState.FAILED else ""
    return f"dependency {job_id} {DEPENDENCY_ENDS[dep.state]}{how}"
