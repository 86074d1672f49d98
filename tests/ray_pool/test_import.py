"""``import hwpool`` never imports Ray; ``hwpool.ray``'s public names are documented."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest


def test_importing_hwpool_does_not_import_ray() -> None:
    code = "import sys, hwpool, hwpool.__main__; print('ray' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


def test_hwpool_ray_public_names_are_documented_and_live_in_hwpool_ray() -> None:
    pytest.importorskip("ray")
    import hwpool.ray  # noqa: PLC0415 - only where Ray is installed

    for name in hwpool.ray.__all__:
        obj = getattr(hwpool.ray, name)
        assert inspect.getdoc(obj), name
        assert obj.__module__ == "hwpool.ray", name
