"""Fake GPU machines for detection tests: a ``nvidia-smi`` script and a ``pynvml`` module.

A machine is a list of :class:`FakeGPU`; both fakes describe the same machine, so a test can
check that NVML and nvidia-smi agree. The fake nvidia-smi prints ``-L``, the CSV queries and,
for no argument, the default table's "MIG devices" section (each MIG device's GPU and compute
instance and its memory, as driver 590 prints it). ``used_mib`` is the memory in use; None
(the default) is a reading the driver cannot give: nvidia-smi prints ``[N/A]`` (``N/A`` in the
MIG table) and NVML's memory record has no ``used``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from fakes.nvml_errors import CODES


@dataclass(frozen=True)
class FakeMIG:
    """A MIG device: ``memory_mib`` is its GPU instance's memory. ``gi`` and ``ci``: its GPU
    and compute instance ids (``gi`` None: the slot number plus one, a GPU instance of its
    own); devices with one ``gi`` share that memory, as the driver reports it."""

    uuid: str
    profile: str
    memory_mib: int
    used_mib: int | None = None
    gi: int | None = None
    ci: int = 0


@dataclass(frozen=True)
class FakeGPU:
    uuid: str
    name: str
    memory_mib: int
    migs: list[FakeMIG | None] | None = field(default=None)
    """None: no MIG support; []: MIG-capable, disabled; None entries: empty NVML slots."""
    used_mib: int | None = None
    utilization: int | None = None
    """Percent busy, for the watcher's query; None: nvidia-smi prints ``[N/A]``."""
    processes: tuple[tuple[int, int | None], ...] = ()
    """Compute processes (pid, MiB in use; None: ``[N/A]``), for the watcher's query."""
    reserved_mib: int | None = None
    """``memory.reserved``; None: nvidia-smi prints ``[N/A]`` and NVML has no v2 record."""
    failing: dict[str, str] = field(default_factory=dict)
    """NVML function -> the error it raises on this GPU, by pynvml's class suffix
    (``GpuIsLost``, ``Unknown``, ``NotSupported``, ``NoPermission``: see fakes/nvml_errors)."""


A100 = FakeGPU("GPU-a100aaaa-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB", 81920, [])
RTX = FakeGPU("GPU-4090bbbb-0000-0000-0000-000000000000", "NVIDIA GeForce RTX 4090", 24564)
H100_MIG = FakeGPU(
    "GPU-h100cccc-0000-0000-0000-000000000000",
    "NVIDIA H100 80GB HBM3",
    81559,
    [
        FakeMIG("MIG-11111111-aaaa-5b67-8d8e-000000000000", "3g.40gb", 40448),
        None,  # an empty slot between instances
        FakeMIG("MIG-22222222-bbbb-5b67-8d8e-000000000000", "2g.20gb", 20096),
        FakeMIG("MIG-33333333-cccc-5b67-8d8e-000000000000", "1g.10gb", 9856),
    ],
)


def smi_script(machine: list[FakeGPU], *, log: str | None = None) -> str:
    """The body of a fake ``nvidia-smi`` for ``machine``: the CSV queries (detection's and the
    watcher's) and ``-L``.

    ``log``: a file each call appends its arguments to.
    """
    query = "".join(
        f"{i}, {g.uuid}, {g.name}, {g.memory_mib}, {_smi_mib(g.used_mib)}, "
        f"{_smi_mib(g.reserved_mib)}\n"
        for i, g in enumerate(machine)
    )
    in_use = "".join(f"{g.uuid}, {_smi_mib(g.used_mib)}\n" for g in machine)
    watched = "".join(
        f"{g.uuid}, {g.memory_mib}, {_smi_mib(g.used_mib)}, {_smi_mib(g.utilization)}, "
        f"{_smi_mib(g.reserved_mib)}\n"
        for g in machine
    )
    apps = "".join(
        f"{g.uuid}, {pid}, {_smi_mib(mib)}\n" for g in machine for pid, mib in g.processes
    )
    listing = ""
    table = _MIG_TABLE_HEAD
    for i, gpu in enumerate(machine):
        listing += f"GPU {i}: {gpu.name} (UUID: {gpu.uuid})\n"
        migs = [(slot, m) for slot, m in enumerate(gpu.migs or []) if m is not None]
        for j, (slot, mig) in enumerate(migs):
            listing += f"  MIG {mig.profile:<11} Device {j:>2}: (UUID: {mig.uuid})\n"
            gi = slot + 1 if mig.gi is None else mig.gi
            used = "N/A" if mig.used_mib is None else f"{mig.used_mib}MiB"
            table += (
                f"|  {i}  {gi:>3} {mig.ci:>3} {j:>3}  |  {used:>17} / {mig.memory_mib:>6}MiB"
                "    | 16      0 |  1   0    1    0    1 |\n"
            )
    logging = f'echo "$@" >> {log}\n' if log else ""
    return (
        f'{logging}case "$1" in\n'
        f"  -L) cat <<'EOF'\n{listing}EOF\n  ;;\n"
        f"  '') cat <<'EOF'\n{table}EOF\n  ;;\n"
        f"  --query-gpu=uuid,memory.used) cat <<'EOF'\n{in_use}EOF\n  ;;\n"
        f"  --query-gpu=uuid,memory.total,memory.used,utilization.gpu,memory.reserved) "
        f"cat <<'EOF'\n"
        f"{watched}EOF\n  ;;\n"
        f"  --query-compute-apps=gpu_uuid,pid,used_memory) cat <<'EOF'\n{apps}EOF\n  ;;\n"
        f"  --query-gpu=*) cat <<'EOF'\n{query}EOF\n  ;;\n"
        "  *) exit 2 ;;\nesac\n"
    )


_MIG_TABLE_HEAD = """\
+-----------------------------------------------------------------------------------------+
| MIG devices:                                                                            |
+------------------+----------------------------------+-----------+-----------------------+
| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |
|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |
|==================+==================================+===========+=======================|
"""
"""The head of the default table's "MIG devices" section, as driver 590 prints it (see
tests/fakes/captures/); the fake prints one row per MIG device below it."""


def _smi_mib(mib: int | None) -> str:
    return "[N/A]" if mib is None else str(mib)


def nvml_module(
    machine: list[FakeGPU], *, fail_init: str | None = None, non_root: bool = False
) -> str:
    """The source of a fake ``pynvml`` for ``machine``; ``fail_init``: nvmlInit raises that.

    It raises NVML's own error classes, with their codes (``value``) and texts, as
    nvidia-ml-py does (self-contained: a server process may import it). A GPU's ``failing``
    makes that function raise on that GPU; ``nvmlDeviceGetHandleByIndex`` included (a lost
    GPU). Memory comes as the v2 record (``reserved`` apart) where the GPU has
    ``reserved_mib``, else the v2 entry point is missing (FunctionNotFound) and the original
    record's ``used`` is what is in use.

    ``non_root``: as for a user without privileges, a MIG-enabled GPU's own handle answers
    NVML_ERROR_NO_PERMISSION to its memory info (documented: "In MIG mode, if device handle
    is provided, the API returns aggregate information, only if the caller has appropriate
    privileges") and, to test the fallback, to its MIG mode; MIG handles answer as usual.
    """
    data = json.dumps([asdict(g) for g in machine])
    errors = "".join(
        f"\n\nclass NVMLError_{name}(NVMLError):\n    value = {code}\n\n"
        f"    def __init__(self, *args):\n        NVMLError.__init__(self, {text!r})\n"
        for name, (code, text) in CODES.items()
    )
    return f'''"""A fake pynvml (nvidia-ml-py) for tests."""
import json

MACHINE = json.loads({data!r})
for _gpu in MACHINE:
    for _slot, _mig in enumerate(_gpu.get("migs") or []):
        if _mig is not None and _mig["gi"] is None:
            _mig["gi"] = _slot + 1
FAIL_INIT = {fail_init!r}
NON_ROOT = {non_root!r}
NVML_DEVICE_MIG_ENABLE = 1
nvmlMemory_v2 = 0x02000028
calls = []


class NVMLError(Exception):
    value = 999
{errors}

def _check(h, name):
    failure = (h.get("failing") or {{}}).get(name)
    if failure:
        raise globals()["NVMLError_" + failure]()


def _denied(h):
    if NON_ROOT and h.get("migs"):
        raise NVMLError_NoPermission()


class _Memory:
    def __init__(self, mib, used_mib, reserved_mib):
        self.total = mib * 2**20 + 4096  # not a whole MiB: floored
        if reserved_mib is not None:
            self.reserved = reserved_mib * 2**20
        if used_mib is not None:  # else no reading, as from a driver that cannot say
            self.used = max(0, used_mib * 2**20 - 4096)  # not a whole MiB: rounded up
            self.free = self.total - self.used - (reserved_mib or 0) * 2**20


def nvmlInit():
    calls.append("init")
    if FAIL_INIT:
        raise NVMLError(FAIL_INIT)


def nvmlShutdown():
    calls.append("shutdown")


def nvmlDeviceGetCount():
    return len(MACHINE)


def nvmlSystemGetDriverVersion():
    return "590.48.01"  # str, as newer releases return


def nvmlSystemGetNVMLVersion():
    return b"13.590.48"  # bytes, as older releases return


def nvmlSystemGetCudaDriverVersion_v2():
    return 13010


def nvmlDeviceGetHandleByIndex(i):
    _check(MACHINE[i], "nvmlDeviceGetHandleByIndex")
    return MACHINE[i]


def nvmlDeviceGetUUID(h):
    _check(h, "nvmlDeviceGetUUID")
    return h["uuid"].encode()  # bytes, as older releases return


def nvmlDeviceGetName(h):
    _check(h, "nvmlDeviceGetName")
    return h.get("name") or "MIG " + h["profile"]


def nvmlDeviceGetMemoryInfo(h, version=None):
    _denied(h)
    _check(h, "nvmlDeviceGetMemoryInfo")
    reserved = h.get("reserved_mib")
    if version is not None and reserved is None:
        raise NVMLError_FunctionNotFound()  # a driver before nvmlDeviceGetMemoryInfo_v2
    if version is None and reserved is not None and h.get("used_mib") is not None:
        return _Memory(h["memory_mib"], h["used_mib"] + reserved, None)  # used counts it in
    return _Memory(h["memory_mib"], h.get("used_mib"), reserved if version else None)


def nvmlDeviceGetMigMode(h):
    _denied(h)
    if h.get("migs") is None:
        raise NVMLError_NotSupported()
    return (1 if h["migs"] else 0, 0)


def nvmlDeviceGetMaxMigDeviceCount(h):
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
    migs = h["migs"]
    if i >= len(migs) or migs[i] is None:
        raise NVMLError_NotFound()
    return migs[i]


def nvmlDeviceGetGpuInstanceId(h):
    if "gi" not in h:
        raise NVMLError_NotSupported("Not Supported")  # not a MIG device handle
    return h["gi"]


def nvmlDeviceGetComputeInstanceId(h):
    if "ci" not in h:
        raise NVMLError_NotSupported("Not Supported")
    return h["ci"]
'''
