"""Argument types that more than one subcommand reads."""

from __future__ import annotations

import argparse

from .._core._memory import parse_memory

__all__ = ["MAX_GPUS", "gpu_memory_list"]

MAX_GPUS = 4096
"""The most GPUs a list of sizes may name (a bound, so that a typo cannot exhaust memory)."""


def gpu_memory_list(text: str) -> tuple[int, ...]:
    """``--gpu-memory 80GiB,24GiB``: one memory size per GPU, in MiB."""
    parts = text.split(",")
    if len(parts) > MAX_GPUS:
        raise argparse.ArgumentTypeError(f"at most {MAX_GPUS} GPUs, got {len(parts)}")
    try:
        return tuple(
            parse_memory(part.strip(), f"GPU {i}'s memory") for i, part in enumerate(parts)
        )
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
