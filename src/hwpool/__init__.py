"""hwpool: share one machine's GPUs and CPU cores among concurrent work, fairly and fast."""

from ._backends._base import PoolSnapshot, WaiterSnapshot
from ._core._capacity import UNITS_PER_GPU
from ._cpu._pool import CPUPool
from ._errors import PoolClosedError, RevokedError, WouldBlock
from ._gpu._connect import connect
from ._gpu._lease import GPULease, current_gpus
from ._gpu._pool import GPUPool
from ._host._detect import GPUDetection, GPUInfo, GPUSource, detect_gpus, gpu_memory_in_use
from ._host._sizing import effective_threads, set_threads
from ._host._topology import CPUTopology, NumaNode, cpu_topology
from ._jobs._handle import Job, submit
from ._numa._bind import NumaBinder
from ._numa._pages import BindReason, page_nodes
from ._numa._place import file_page_nodes
from ._numa._results import NumaBinding, NumaReason, NumaResult, PagePlacement, TwoNodes
from ._version import __version__

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
    "Job",
    "NumaBinder",
    "NumaBinding",
    "NumaNode",
    "NumaReason",
    "NumaResult",
    "PagePlacement",
    "PoolClosedError",
    "PoolSnapshot",
    "RevokedError",
    "TwoNodes",
    "WaiterSnapshot",
    "WouldBlock",
    "__version__",
    "connect",
    "cpu_topology",
    "current_gpus",
    "detect_gpus",
    "effective_threads",
    "file_page_nodes",
    "gpu_memory_in_use",
    "page_nodes",
    "set_threads",
    "submit",
]


def _publish() -> None:
    """Give every public class and function ``__module__ = "hwpool"``.

    Reprs, tracebacks and pickles (Ray pickles what it ships) then name ``hwpool.GPUPool``,
    not a private module path that the next reorganisation would break.
    """
    for name in __all__:
        obj = globals()[name]
        if isinstance(obj, type) or callable(obj):
            obj.__module__ = __name__


_publish()
