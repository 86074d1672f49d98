"""hwpool: share one machine's GPUs and CPU cores among concurrent work, fairly and fast."""

from ._capacity import UNITS_PER_GPU
from ._cpu_pool import CPUPool
from ._detect import GPUDetection, GPUInfo, GPUSource, detect_gpus
from ._errors import PoolClosedError, WouldBlock
from ._gpu_pool import GPULease, GPUPool, PoolSnapshot, WaiterSnapshot, current_gpus
from ._numa import BindReason, NumaBinding, page_nodes
from ._numa_bind import TwoNodes
from ._numa_place import PagePlacement, file_page_nodes
from ._sizing import effective_threads, set_threads
from ._topology import CPUTopology, NumaNode, cpu_topology

__version__ = "0.1.0"

__all__ = [
    "UNITS_PER_GPU",
    "BindReason",
    "CPUPool",
    "CPUTopology",
    "GPUDetection",
    "GPUInfo",
    "GPULease",
    "GPUPool",
    "GPUSource",
    "NumaBinding",
    "NumaNode",
    "PagePlacement",
    "PoolClosedError",
    "PoolSnapshot",
    "TwoNodes",
    "WaiterSnapshot",
    "WouldBlock",
    "__version__",
    "cpu_topology",
    "current_gpus",
    "detect_gpus",
    "effective_threads",
    "file_page_nodes",
    "page_nodes",
    "set_threads",
]
