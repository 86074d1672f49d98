"""Choosing how to read the GPUs: NVML where ``pynvml`` imports and initialises, else
nvidia-smi. Nothing imports ``pynvml`` unless it is installed (``pip install 'hwpool[nvml]'``).
"""

from __future__ import annotations

import importlib

from ._nvml import NvmlSampler
from ._sample import Sampler
from ._smi import SmiSampler

__all__ = ["open_sampler"]


def open_sampler(smi_timeout: float = 5.0) -> tuple[Sampler, str]:
    """A sampler and why it was chosen, in words (for the server's log).

    NVML is initialised here, so that a machine without the driver falls back at once; the
    NVML sampler holds that initialisation until its ``close()``.
    """
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        why = "pynvml not installed: pip install 'hwpool[nvml]'"
        return SmiSampler(smi_timeout), f"watching with nvidia-smi ({why})"
    sampler = NvmlSampler(nvml)
    failed = sampler.start()
    if failed:
        return SmiSampler(smi_timeout), f"watching with nvidia-smi ({failed})"
    return sampler, "watching with NVML"
