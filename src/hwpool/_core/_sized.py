"""GPUs of different sizes over the one-size scheduler core: an adapter, until the core takes
per-GPU totals itself.

Every GPU gets the largest total, and each smaller GPU holds a permanent grant of the
difference from the start (``Scheduler.restore``), so its free units never exceed its own
total. Best fit, reservations and the queue walk then work unchanged on what is really free:
best fit takes the GPU with the least memory left after the grant, a waiter reserves the GPU
with the most free memory. What the padding cannot express is a whole GPU of a smaller size
(it is never completely free to the core): whole-GPU requests on GPUs of different sizes are
refused by the callers (:func:`whole_units`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._core._memory import format_mib
from ._scheduler import Scheduler

__all__ = ["sized_scheduler", "whole_units"]


def sized_scheduler(totals: Sequence[int]) -> Scheduler:
    """A core whose GPU ``i`` has ``totals[i]`` units free (positive ints; see the module)."""
    largest = max(totals)
    core = Scheduler(len(totals), units_per_gpu=largest)
    for gpu, total in enumerate(totals):
        if total < largest:
            core.restore((gpu,), largest - total)
    return core


def whole_units(totals: Sequence[int], what: str) -> int:
    """The units of a whole GPU where all GPUs have one size; ValueError naming ``what``
    (the request) where they differ."""
    if len(set(totals)) == 1:
        return totals[0]
    sizes = ", ".join(format_mib(t) for t in sorted(set(totals), reverse=True))
    raise ValueError(
        f"{what}: whole GPUs on GPUs of different sizes ({sizes}) are not supported yet (the "
        "scheduler core takes one size per GPU only through an adapter); ask for memory=..."
    )
