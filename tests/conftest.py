"""Fixtures shared by the whole suite."""

from __future__ import annotations

import importlib
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

import hermetic
from fakes.gpus import FakeGPU, nvml_module

# No per-example deadline and no slow-generation health check anywhere: on a loaded 2-core
# machine one example of a stateful test can take 300 ms, and either then fails a correct test
# (every test is bounded by pytest-timeout instead).
settings.register_profile("hwpool", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("hwpool")


# hwpool's places (the machine-wide socket and config, the per-user socket and job table) are
# pointed into this run's own directory here, at import: this conftest is imported before
# every other one and every test module, some of which copy the environment at import
# (tests/hostserver.py's ENV), and every process started from it inherits them. See
# tests/hermetic.py.
_MADE = hermetic.isolate()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _MADE is not None:
        hermetic.remove(_MADE)


@pytest.fixture(scope="session", autouse=True)
def hermetic_places() -> Iterator[dict[str, str]]:
    """Every test runs with hwpool's places pointed away from the machine's own (set when
    this conftest was imported, before the test modules were); a test that changed them for
    good (not through monkeypatch) fails the session here, at its end."""
    places = hermetic.own()
    assert set(places) == {*hermetic.MACHINE, *hermetic.PER_USER}, places
    yield places
    assert hermetic.own() == places, "a test changed hwpool's places in os.environ for good"


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Return a function installing a fake ``nvidia-smi`` script first on PATH.

    The GPU variables are cleared so that detection reaches the fake, and ``pynvml`` is made
    unimportable (a real nvidia-ml-py would answer first); :func:`fake_nvml` installs a fake.
    """
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.delenv("HWPOOL_NUM_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HWPOOL_SOCKET", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")

    def install(body: str) -> Path:
        exe = tmp_path / "nvidia-smi"
        exe.write_text("#!/bin/sh\n" + body)
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        return exe

    return install


@pytest.fixture
def fake_nvml(
    fake_smi: Callable[[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., ModuleType]:
    """Return a function installing a fake ``pynvml`` for a machine (see tests/fakes/gpus.py)
    on sys.path; the fake nvidia-smi fixture is in place too (no binary until installed)."""

    def install(
        machine: list[FakeGPU], fail_init: str | None = None, non_root: bool = False
    ) -> ModuleType:
        folder = tmp_path / "nvml"
        folder.mkdir(exist_ok=True)
        (folder / "pynvml.py").write_text(
            nvml_module(machine, fail_init=fail_init, non_root=non_root)
        )
        monkeypatch.delitem(sys.modules, "pynvml")
        monkeypatch.syspath_prepend(str(folder))
        return importlib.import_module("pynvml")

    return install
