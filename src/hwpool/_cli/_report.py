"""Text tables and JSON documents for simulated or measured schedules (used by the CLI)."""

from __future__ import annotations

from collections.abc import Sequence

from .._sim._simulate import Outcome, TaskRun

__all__ = ["format_table", "outcome_json", "outcomes_json"]

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def format_table(outcomes: Sequence[Outcome]) -> str:
    """One column per policy: makespan, lower bound, utilisation, then waits per demand class."""
    rows: list[tuple[str, list[str]]] = [
        ("makespan (s)", [f"{o.makespan:.2f}" for o in outcomes]),
        ("makespan lower bound (s)", [f"{o.lower_bound:.2f}" for o in outcomes]),
        ("  counting packing (s)", [f"{o.packing_bound:.2f}" for o in outcomes]),
        ("GPU utilisation", [f"{o.utilization:.0%}" for o in outcomes]),
        ("  at the lower bound", [f"{o.best_utilization:.0%}" for o in outcomes]),
    ]
    timed_out = sum(run.task.timed_out for run in outcomes[0].runs)  # the same in every one
    if any(run.task.limit is not None for run in outcomes[0].runs):
        rows.append(("tasks ended at their limit", [str(timed_out)] * len(outcomes)))
    for index, stats in enumerate(outcomes[0].classes):
        rows.append((f"{stats.label} x{stats.count}", [""] * len(outcomes)))
        for metric in ("p50", "p99", "worst"):
            values = [f"{getattr(o.classes[index], metric):.2f}" for o in outcomes]
            rows.append((f"  {metric} wait (s)", values))
    for index, stats in enumerate(outcomes[0].owners):  # the same owners in every outcome
        rows.append((f"owner {stats.label} x{stats.count}", [""] * len(outcomes)))
        for metric in ("p50", "p99"):
            values = [f"{getattr(o.owners[index], metric):.2f}" for o in outcomes]
            rows.append((f"  {metric} wait (s)", values))
    header = ("", [o.policy for o in outcomes])
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(h), *(len(r[1][i]) for r in rows)) for i, h in enumerate(header[1])]
    lines = []
    for label, cells in [header, *rows]:
        padded = (cell.rjust(width) for cell, width in zip(cells, widths, strict=True))
        lines.append(f"{label.ljust(label_width)}  " + "  ".join(padded))
    return "\n".join(line.rstrip() for line in lines)


def _run_json(run: TaskRun) -> dict[str, JSONValue]:
    asked: dict[str, JSONValue] = {"demand": run.task.demand}
    if run.task.memory_mib is not None:
        asked = {"memory": run.task.memory_mib}  # MiB: reads back as the same task
    if run.task.owner is not None:
        asked["owner"] = run.task.owner
    if run.task.priority:
        asked["priority"] = run.task.priority
    limited: dict[str, JSONValue] = {}
    if run.task.limit is not None:  # the limit reads back; timed_out says how it ran
        limited = {"limit": run.task.limit, "timed_out": run.task.timed_out}
    return {
        "name": run.task.name,
        "arrival": run.task.arrival,
        **asked,
        "duration": run.task.duration,
        **limited,
        "start": run.start,
        "end": run.end,
        "wait": run.wait,
        "gpus": list(run.gpus),
    }


def _machine_json(outcome: Outcome) -> dict[str, JSONValue]:
    """``gpu_memory`` (MiB per GPU) for a machine sized in memory; nothing otherwise."""
    if outcome.gpu_memory is None:
        return {}
    return {"gpu_memory": list(outcome.gpu_memory)}


def _owners_json(outcome: Outcome) -> dict[str, JSONValue]:
    """``owners``: waits per owner, when the tasks have more than one; nothing otherwise."""
    if not outcome.owners:
        return {}
    return {
        "owners": {
            s.label: {"count": s.count, "p50": s.p50, "p99": s.p99, "max": s.worst}
            for s in outcome.owners
        }
    }


def outcome_json(outcome: Outcome) -> dict[str, JSONValue]:
    """One schedule as a JSON-ready dict: tasks, makespan, lower bound, utilisation, waits."""
    return {
        "policy": outcome.policy,
        "gpus": outcome.num_gpus,
        **_machine_json(outcome),
        "makespan": outcome.makespan,
        "lower_bound": outcome.lower_bound,
        "packing_bound": outcome.packing_bound,
        "utilization": outcome.utilization,
        "waits": {
            s.label: {"count": s.count, "p50": s.p50, "p99": s.p99, "max": s.worst}
            for s in outcome.classes
        },
        **_owners_json(outcome),
        "tasks": [_run_json(run) for run in outcome.runs],
    }


def outcomes_json(outcomes: Sequence[Outcome]) -> dict[str, JSONValue]:
    """One policy: its object. Several: shared fields plus ``policies``, one object each."""
    if len(outcomes) == 1:
        return outcome_json(outcomes[0])
    return {
        "gpus": outcomes[0].num_gpus,
        **_machine_json(outcomes[0]),
        "lower_bound": outcomes[0].lower_bound,
        "packing_bound": outcomes[0].packing_bound,
        "policies": {o.policy: outcome_json(o) for o in outcomes},
    }
