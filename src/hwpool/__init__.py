"""hwpool: share one machine's GPUs and CPU cores among concurrent work, fairly and fast.

The public names are loaded on first use (PEP 562): ``import hwpool`` imports only this
module and the version, so that the ``hwpool`` command, which needs little of the library for
most of its subcommands, starts fast. ``hwpool.GPUPool`` (or ``from hwpool import GPUPool``)
imports the module that defines it, then publishes it: see :func:`_publish_loaded`.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:  # what type checkers see; at run time _HOMES says the same (a test checks)
    from ._backends._base import PoolSnapshot, WaiterSnapshot
    from ._core._capacity import UNITS_PER_GPU
    from ._cpu._pool import CPUPool
    from ._errors import PoolClosedError, RevokedError, WouldBlock
    from ._gpu._connect import connect
    from ._gpu._lease import GPULease, current_gpus
    from ._gpu._pool import GPUPool
    from ._gpu._torch import torch_limit
    from ._host._detect import GPUDetection, GPUInfo, GPUSource, detect_gpus, gpu_memory_in_use
    from ._host._sizing import effective_threads, set_threads
    from ._host._topology import CPUTopology, NumaNode, cpu_topology
    from ._jobs._handle import Job, submit
    from ._numa._bind import NumaBinder
    from ._numa._pages import BindReason, page_nodes
    from ._numa._place import file_page_nodes
    from ._numa._results import NumaBinding, NumaReason, NumaResult, PagePlacement, TwoNodes

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
    "torch_limit",
]

_HOMES: dict[str, str] = {
    "PoolSnapshot": "_backends._base",
    "WaiterSnapshot": "_backends._base",
    "UNITS_PER_GPU": "_core._capacity",
    "CPUPool": "_cpu._pool",
    "PoolClosedError": "_errors",
    "RevokedError": "_errors",
    "WouldBlock": "_errors",
    "connect": "_gpu._connect",
    "GPULease": "_gpu._lease",
    "current_gpus": "_gpu._lease",
    "GPUPool": "_gpu._pool",
    "torch_limit": "_gpu._torch",
    "GPUDetection": "_host._detect",
    "GPUInfo": "_host._detect",
    "GPUSource": "_host._detect",
    "detect_gpus": "_host._detect",
    "gpu_memory_in_use": "_host._detect",
    "effective_threads": "_host._sizing",
    "set_threads": "_host._sizing",
    "CPUTopology": "_host._topology",
    "NumaNode": "_host._topology",
    "cpu_topology": "_host._topology",
    "Job": "_jobs._handle",
    "submit": "_jobs._handle",
    "NumaBinder": "_numa._bind",
    "BindReason": "_numa._pages",
    "page_nodes": "_numa._pages",
    "file_page_nodes": "_numa._place",
    "NumaBinding": "_numa._results",
    "NumaReason": "_numa._results",
    "NumaResult": "_numa._results",
    "PagePlacement": "_numa._results",
    "TwoNodes": "_numa._results",
}
"""The module (under this package) that defines each public name but ``__version__``."""


def _load(name: str) -> object:
    """The public name ``name``, its module imported on first use (this module's
    ``__getattr__``, which Python calls only for a name not yet in the module)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    _publish_loaded()
    return value


def _publish_loaded() -> None:
    """Publish every public name whose module is loaded: bind it here (later uses find it
    without calling ``__getattr__``) and give it ``__module__ = "hwpool"``.

    Reprs, tracebacks and pickles (Ray pickles what it ships) then name ``hwpool.GPUPool``,
    not a private module path that the next reorganisation would break; and a pickle of one
    loads through this module's ``__getattr__``. Every loaded module counts, not only the one
    asked for, so that what a public object hands out without its name being looked up here
    (the GPULease a GPUPool returns, the PoolClosedError it raises) is published with it: the
    modules of the public names import, when they load, the modules of all they return.
    """
    names = globals()
    for name, home in _HOMES.items():
        module = sys.modules.get(f"{__name__}.{home}")
        if name in names or module is None or not hasattr(module, name):
            continue  # published already, not loaded, or still loading (an import cycle)
        value = getattr(module, name)
        if isinstance(value, type) or callable(value):
            value.__module__ = __name__
        names[name] = value


def __dir__() -> list[str]:
    """The module's names, the public ones not yet loaded included."""
    return sorted({*globals(), *__all__})


if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt hwpool.X stays an error
    __getattr__ = _load
