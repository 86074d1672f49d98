"""What the GPUs really do: live sampling, which lease each GPU process belongs to, memory
held outside the queue (with hysteresis) and leases over their memory.

Library code for the host server (not wired into it yet; see docs/observability.md):

- :mod:`._sample`: the records of one reading; :mod:`._nvml` and :mod:`._smi` read them
  through NVML or nvidia-smi, and :mod:`._open` chooses between the two;
- :mod:`._procfs`: a process's parent, group, session and uid, from /proc;
- :mod:`._proof`: which of a lease's processes may be signalled (its proven job group);
- :mod:`._attribute`: each GPU process to a lease, or outside the queue (pure);
- :mod:`._hold`: how much outside memory to withhold, with hysteresis (pure);
- :mod:`._overlease`: leases over their memory, and the ``warn``/``term``/``off`` policy (pure);
- :mod:`._watcher`: one step of all of these, as the server will call it each interval.

It imports only ``_host`` (and the leaves) of hwpool.
"""

from ._attribute import Attributed, LeaseProcs, attribute, lease_use_mib, outside_mib
from ._hold import Hold, HoldRule, OutsideHold, hold_step
from ._nvml import NvmlSampler
from ._open import open_sampler
from ._overlease import LeaseShare, OverLeasePolicy, OverLeaseWatch, OverUse, parse_policy
from ._procfs import NsIds, ProcFS, ProcReader, ProcStat
from ._sample import GPUProcess, GPUReading, Sample, Sampler
from ._smi import SmiSampler
from ._watcher import Watcher, WatchReport

__all__ = [
    "Attributed",
    "GPUProcess",
    "GPUReading",
    "Hold",
    "HoldRule",
    "LeaseProcs",
    "LeaseShare",
    "NsIds",
    "NvmlSampler",
    "OutsideHold",
    "OverLeasePolicy",
    "OverLeaseWatch",
    "OverUse",
    "ProcFS",
    "ProcReader",
    "ProcStat",
    "Sample",
    "Sampler",
    "SmiSampler",
    "WatchReport",
    "Watcher",
    "attribute",
    "hold_step",
    "lease_use_mib",
    "open_sampler",
    "outside_mib",
    "parse_policy",
]
