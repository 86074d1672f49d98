"""The README's "Scaling out with Ray" example runs as printed, on the session's cluster."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_ray_example_runs(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    section = README.split("## Scaling out with Ray", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: None)  # connected already
    printed = io.StringIO()
    env: dict[str, Any] = {"__name__": "hwpool_readme"}  # not importable: shipped by value
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code.group(1), "README.md", "exec"), env)
    finally:
        if "pool" in env:
            env["pool"].close()  # its client, and the actor the example started, end
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor("hwpool-scheduler", namespace="hwpool"))
    tasks, actor = (ast.literal_eval(line) for line in printed.getvalue().splitlines())
    assert len(tasks) == 9 and all(" on GPU" in t for t in tasks)
    assert tasks[-1] == "100 steps on GPUs [0, 1]"
    assert len(actor) == 1
