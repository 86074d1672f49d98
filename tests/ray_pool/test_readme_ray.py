"""The README's Ray example (copied in docs/ray-usage.md) runs as printed, on the session's
cluster."""

from __future__ import annotations

import ast
import contextlib
import io
from typing import Any

import pytest

from docblocks import blocks_tested_by

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


def test_the_ray_example_runs(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (code,) = (block.code for block in blocks_tested_by(__file__))
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: None)  # connected already
    printed = io.StringIO()
    env: dict[str, Any] = {"__name__": "hwpool_readme"}  # not importable: shipped by value
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md", "exec"), env)
    finally:
        if "pool" in env:
            env["pool"].close()  # its client, and the actor the example started, end
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor("hwpool-scheduler", namespace="hwpool"))
    tasks, actor = (ast.literal_eval(line) for line in printed.getvalue().splitlines())
    assert len(tasks) == 9 and all(" on GPU" in t for t in tasks)
    assert tasks[-1] == "100 steps on GPUs [0, 1]"
    assert len(actor) == 1
