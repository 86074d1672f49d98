"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """Return a function installing a fake ``nvidia-smi`` script first on PATH.

    The GPU variables are cleared so that detection reaches the fake.
    """
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
