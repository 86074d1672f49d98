"""A fake CUDA driver: ``libcuda.c`` built into a ``libcuda.so.1`` that hwpool's probe loads
when its folder is on ``LD_LIBRARY_PATH`` (see the C file for what it answers)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).parent / "libcuda.c"


def build_libcuda(folder: Path) -> Path | None:
    """``folder/libcuda.so.1`` built from the fake's source; None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    library = folder / "libcuda.so.1"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library), str(SOURCE)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return library


def body(uuid: str) -> str:
    """A UUID as the fake takes it and the probe gives it back: no ``GPU-``/``MIG-``."""
    return uuid.split("-", 1)[1]
