"""NVML's errors as nvidia-ml-py raises them, for the fake ``pynvml`` modules.

nvidia-ml-py raises ``NVMLError(code)``, which becomes the subclass for that code:
``NVMLError_GpuIsLost`` for ``NVML_ERROR_GPU_IS_LOST`` (15) and so on, each with the code in
``value`` and the text NVML gives for it. The codes and texts are NVML's (nvmlReturn_t in the
NVML API reference; nvidia-ml-py's ``_errcode_to_string``). A missing entry point is
``NVMLError_FunctionNotFound`` (nvidia-ml-py looks the C symbol up when called), and its
unversioned names over an older driver raise ``NVMLLibraryMismatchError``.
"""

from __future__ import annotations

CODES = {
    "Uninitialized": (1, "Uninitialized"),
    "InvalidArgument": (2, "Invalid Argument"),
    "NotSupported": (3, "Not Supported"),
    "NoPermission": (4, "Insufficient Permissions"),
    "NotFound": (6, "Not Found"),
    "InsufficientPower": (8, "Insufficient External Power"),
    "DriverNotLoaded": (9, "Driver Not Loaded"),
    "FunctionNotFound": (13, "Function Not Found"),
    "GpuIsLost": (15, "GPU is lost"),
    "ResetRequired": (16, "GPU requires restart"),
    "LibRmVersionMismatch": (18, "RM has detected an NVML/RM version mismatch."),
    "Unknown": (999, "Unknown Error"),
}
"""Class name suffix -> (NVML_ERROR_* code, NVML's text)."""


class NVMLError(Exception):
    """NVML's error: ``value`` is the NVML_ERROR_* code."""

    value = 999

    def __str__(self) -> str:
        return self.args[0] if self.args else "Unknown Error"


class NVMLLibraryMismatchError(Exception):
    """nvidia-ml-py's unversioned name called over a driver without the newest symbol."""


def _subclass(suffix: str, code: int, text: str) -> type[NVMLError]:
    def init(self: NVMLError, *args: object) -> None:
        NVMLError.__init__(self, text)

    return type(f"NVMLError_{suffix}", (NVMLError,), {"value": code, "__init__": init})


CLASSES: dict[str, type[NVMLError]] = {
    name: _subclass(name, code, text) for name, (code, text) in CODES.items()
}
NVMLError_NotSupported = CLASSES["NotSupported"]
NVMLError_NotFound = CLASSES["NotFound"]
NVMLError_Uninitialized = CLASSES["Uninitialized"]
NVMLError_FunctionNotFound = CLASSES["FunctionNotFound"]
NVMLError_GpuIsLost = CLASSES["GpuIsLost"]
NVMLError_NoPermission = CLASSES["NoPermission"]
NVMLError_Unknown = CLASSES["Unknown"]


def error(name: str) -> NVMLError:
    """The error a fake raises for ``name``: NVML's own class for a known suffix
    (``GpuIsLost``), else a plain NVMLError with ``name`` as its text."""
    known = CLASSES.get(name)
    return known() if known is not None else NVMLError(name)
