"""hwpool: share one machine's GPUs and CPU cores among concurrent work, fairly and fast."""

from ._capacity import UNITS_PER_GPU
from ._cpu_pool import CPUPool
from ._detect import GPUDetection, GPUInfo, GPUSource, detect_gpus
from ._errors import PoolClosedError, WouldBlock
from ._gpu_pool import GPULease, GPUPool, PoolSnapshot, WaiterSnapshot, current_gpus
from ._sizing import effective_threads, set_threads
from ._topology import CPUTopology, NumaNode, cpu_topology

__version__ = "0.1.0"

__all__ = [
    "UNITS_PER_GPU",
    "CPUPool",
    "CPUTopology",
    "GPUDetection",
    "GPUInfo",
    "GPULease",
    "GPUPool",
    "GPUSource",
    "NumaNode",
    "PoolClosedError",
    "PoolSnapshot",
    "WaiterSnapshot",
    "WouldBlock",
    "__version__",
    "cpu_topology",
    "current_gpus",
    "detect_gpus",
    "effective_threads",
    "set_threads",
]
