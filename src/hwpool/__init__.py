"""hwpool: share one machine's GPUs and CPU cores among concurrent work, fairly and fast."""

from ._capacity import UNITS_PER_GPU
from ._detect import GPUDetection, GPUInfo, GPUSource, detect_gpus
from ._errors import PoolClosedError, WouldBlock
from ._gpu_pool import GPULease, GPUPool, PoolSnapshot, WaiterSnapshot, current_gpus

__version__ = "0.1.0"

__all__ = [
    "UNITS_PER_GPU",
    "GPUDetection",
    "GPUInfo",
    "GPULease",
    "GPUPool",
    "GPUSource",
    "PoolClosedError",
    "PoolSnapshot",
    "WaiterSnapshot",
    "WouldBlock",
    "__version__",
    "current_gpus",
    "detect_gpus",
]
