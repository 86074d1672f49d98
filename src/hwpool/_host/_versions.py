"""Which driver, NVML and CUDA versions this machine has, for ``hwpool info``.

NVML first (``nvmlSystemGetDriverVersion``, ``nvmlSystemGetNVMLVersion``,
``nvmlSystemGetCudaDriverVersion_v2``), else ``nvidia-smi --version``, whose lines read
``DRIVER version : 590.48.01``; on Windows drivers that line says ``Deprecated, see "KMD
version" instead`` and the versions are the ``KMD version`` and ``CUDA UMD version`` lines.
Where ``--version`` is not understood (older drivers), ``--query-gpu=driver_version``. A value
no source gives is None: nothing is guessed.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._nvml import nvml_text
from ._smi import run_nvidia_smi

__all__ = ["DriverVersions", "driver_versions", "parse_smi_version"]

_LINE = re.compile(r"\s*(.+?)\s+version\s*:\s*(.*?)\s*", re.IGNORECASE)
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)+")


@dataclass(frozen=True)
class DriverVersions:
    """The versions found and ``source``, where (``nvml``, ``nvidia-smi``, or ``none`` with
    ``problem`` saying why)."""

    driver: str | None
    nvml: str | None
    cuda: str | None
    source: str
    problem: str = ""


def driver_versions(timeout: float) -> DriverVersions:
    """The versions from NVML where it imports and answers, else from nvidia-smi."""
    found = _from_nvml()
    if found is not None:
        return found
    return _from_smi(timeout)


def _from_nvml() -> DriverVersions | None:
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:  # not installed, or no driver: nvidia-smi is asked
        return None
    try:
        driver = _text(nvml, "nvmlSystemGetDriverVersion")
        library = _text(nvml, "nvmlSystemGetNVMLVersion")
        cuda = _ask(nvml, "nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = _ask(nvml, "nvmlSystemGetCudaDriverVersion")
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    if driver is None and library is None and cuda is None:
        return None
    return DriverVersions(driver, library, cuda_version(cuda), "nvml")


def _ask(nvml: Any, name: str) -> Any:
    function: Callable[[], Any] | None = getattr(nvml, name, None)
    if function is None:
        return None
    try:
        return function()
    except Exception:  # this one value is unknown
        return None


def _text(nvml: Any, name: str) -> str | None:
    value = _ask(nvml, name)
    return None if value is None else nvml_text(value)


def cuda_version(number: object) -> str | None:
    """NVML's CUDA driver version number as CUDA writes it: 13010 -> ``13.1``."""
    if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
        return None
    return f"{number // 1000}.{number % 1000 // 10}"


def _from_smi(timeout: float) -> DriverVersions:
    output, failure = run_nvidia_smi(("--version",), timeout)
    if output is not None:
        found = parse_smi_version(output)
        if found.driver is not None:
            return found
    query = ("--query-gpu=driver_version", "--format=csv,noheader")
    listed, _ = run_nvidia_smi(query, timeout)
    driver = (listed or "").strip().splitlines()[:1]
    if driver and _VERSION.fullmatch(driver[0].strip()):
        return DriverVersions(driver[0].strip(), None, None, "nvidia-smi")
    return DriverVersions(None, None, None, "none", failure or "nvidia-smi gave no version")


def parse_smi_version(text: str) -> DriverVersions:
    """``nvidia-smi --version``'s lines as versions (see the module docstring)."""
    lines = {}
    for line in text.splitlines():
        match = _LINE.fullmatch(line)
        if match:
            lines[match.group(1).lower()] = match.group(2)

    def value(*keys: str) -> str | None:
        for key in keys:
            said = lines.get(key)
            if said and not said.lower().startswith("deprecated"):
                return said
        return None

    return DriverVersions(
        value("driver", "kmd"), value("nvml"), value("cuda", "cuda umd"), "nvidia-smi"
    )
