"""``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` read as CUDA reads them.

What CUDA documents (CUDA Programming Guide, "CUDA Environment Variables",
``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``; MIG User Guide, "CUDA Device
Enumeration"):

- unset: every GPU; set but empty: no GPU.
- entries are GPU indexes, GPU UUIDs (``GPU-...``, or a prefix of one that names a single GPU)
  or MIG device UUIDs (``MIG-<uuid>``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``); the first
  invalid entry ends the list (``0,2,-1,1`` is GPUs 0 and 2). An index the machine does not
  have, or a UUID or prefix that names no GPU or several, is invalid like ``-1``.
- a CUDA process enumerates one MIG device only: the first one listed.
- indexes follow ``CUDA_DEVICE_ORDER``: ``FASTEST_FIRST`` (the default) or ``PCI_BUS_ID``
  (nvidia-smi's and NVML's order).

What the documentation does not say is read the way PyTorch's model of the driver's parser
reads it (``torch.cuda._parse_visible_devices``): a list is of one kind, set by its first
entry (an index ends a list of UUIDs, and the other way round), and a device listed twice
makes no device visible. An entry with anything but ASCII digits is not an index here
(``1gpu``), where the driver may read a leading number: hwpool then sees fewer GPUs than
CUDA, never one more.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ._devices import GPUInfo

__all__ = ["ORDER_VAR", "VISIBLE_VAR", "CudaAnswer", "no_gpu_message", "read_visible"]

VISIBLE_VAR = "CUDA_VISIBLE_DEVICES"
ORDER_VAR = "CUDA_DEVICE_ORDER"
PCI_ORDER = "PCI_BUS_ID"

CudaAnswer = Callable[[], tuple[tuple[str, ...] | None, str]]
"""Asks the CUDA driver which devices it enumerates (see ``_cuda.cuda_devices``)."""

_INDEX = re.compile(r"[0-9]+")
_GPU = re.compile(r"GPU-[0-9A-Za-z-]+")
_MIG = re.compile(r"MIG-(?!GPU-)[0-9A-Za-z-]+")
_MIG_OLD = re.compile(r"MIG-(GPU-[0-9A-Za-z-]+)/([0-9]+)/([0-9]+)")


@dataclass
class _Machine:
    """The devices detection found, as CUDA's entries name them."""

    whole: dict[int, GPUInfo] = field(default_factory=dict)  # nvidia-smi index -> GPU
    gpus: dict[str, GPUInfo | None] = field(default_factory=dict)  # UUID -> GPU (None: MIG on)
    migs: dict[str, GPUInfo] = field(default_factory=dict)  # MIG UUID -> MIG device
    count: int = 0  # physical GPUs

    @classmethod
    def of(cls, found: Sequence[GPUInfo]) -> _Machine:
        machine = cls()
        for device in found:
            if device.is_mig and device.uuid:
                machine.migs[device.uuid] = device
                machine.gpus.setdefault(device.parent or "", None)
            elif _INDEX.fullmatch(device.device_id):
                machine.whole[int(device.device_id)] = device
                if device.uuid:
                    machine.gpus[device.uuid] = device
        highest = max(machine.whole, default=-1) + 1
        parents = sum(gpu is None for gpu in machine.gpus.values())
        machine.count = max(highest, len(machine.whole) + parents)
        return machine

    def alike(self) -> bool:
        """Whether CUDA's speed order must be nvidia-smi's PCI order: one GPU, or GPUs all
        of one name and size (nothing to rank them by, so CUDA keeps them in PCI order)."""
        if self.count <= 1:
            return True
        kinds = {(g.name, g.memory_mib) for g in self.whole.values()}
        known = all(n is not None and m is not None for n, m in kinds)
        return not self.migs and len(self.whole) == self.count and len(kinds) == 1 and known

    def by_body(self, body: str) -> GPUInfo | None:
        """The device whose UUID, less its ``GPU-``/``MIG-`` prefix, is ``body``."""
        for uuid, device in (*self.migs.items(), *self.gpus.items()):
            if uuid[4:].lower() == body.lower():
                return device
        return None


def read_visible(
    raw: str, found: Sequence[GPUInfo] | None, order: str | None, ask_cuda: CudaAnswer
) -> tuple[tuple[GPUInfo, ...], str]:
    """The devices ``CUDA_VISIBLE_DEVICES=raw`` makes visible, and what was left out and why
    (empty when nothing was).

    ``found``: what NVML or nvidia-smi found (None when neither answered: entries are then
    taken as given, unchecked). A device detection knows comes with its UUID, memory and
    name; ``device_id`` is its entry. Indexes with ``CUDA_DEVICE_ORDER`` other than
    ``PCI_BUS_ID`` on GPUs that differ are numbered by the CUDA driver itself
    (``ask_cuda``); ValueError naming ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` where it cannot be
    asked.
    """
    if not raw.strip():
        return (), "empty (CUDA reads that as no GPU)"
    machine = None if found is None else _Machine.of(found)
    taken: list[tuple[str, GPUInfo | None]] = []
    keys: list[str] = []
    kind = None
    note = ""
    for position, part in enumerate(raw.split(",")):
        entry = part.strip()
        this = _kind(entry)
        why = None
        if this is None:
            why = "is not an index, a GPU UUID or a MIG UUID"
        elif kind is not None and this != kind:
            why = f"is not of the list's kind ({kind}s): CUDA reads one kind per list"
        elif kind == "MIG":
            why = "is a second MIG device: a CUDA process enumerates one MIG device only"
        device, key, invalid = _resolve(entry, this, machine) if why is None else (None, "", None)
        why = why or invalid
        if why is not None:
            rest = ",".join(p.strip() for p in raw.split(",")[position:])
            note = f"entry {entry!r} {why}, and CUDA reads no further: {rest!r} left out"
            break
        if key in keys:
            first = keys.index(key)
            note = (
                f"entry {entry!r} names the device of entry {taken[first][0]!r} again, "
                "and a device listed twice makes CUDA enumerate none"
            )
            return (), note
        keys.append(key)
        taken.append((entry, device))
        kind = this
    gpus = tuple(
        GPUInfo(i, entry) if device is None else replace(device, index=i, device_id=entry)
        for i, (entry, device) in enumerate(taken)
    )
    if kind == "index" and machine is not None and order != PCI_ORDER and not machine.alike():
        return _numbered_by_cuda(raw, order, machine, [e for e, _ in taken], ask_cuda), note
    return gpus, note


def _kind(entry: str) -> str | None:
    if _INDEX.fullmatch(entry):
        return "index"
    if _GPU.fullmatch(entry):
        return "GPU UUID"
    if _MIG.fullmatch(entry) or _MIG_OLD.fullmatch(entry):
        return "MIG"
    return None


def _resolve(
    entry: str, kind: str | None, machine: _Machine | None
) -> tuple[GPUInfo | None, str, str | None]:
    """The device ``entry`` names (None where detection does not know it), a key that is the
    same for two entries naming one device, and why the entry is invalid (None if it is not)."""
    if machine is None:
        return None, str(int(entry)) if kind == "index" else entry, None
    if kind == "index":
        index = int(entry)
        if index >= machine.count:
            return None, "", f"is out of range (this machine has {_count(machine.count)})"
        device = machine.whole.get(index)
        return device, device.uuid if device and device.uuid else f"#{index}", None
    old = _MIG_OLD.fullmatch(entry)
    if old:
        parents = [uuid for uuid, gpu in machine.gpus.items() if gpu is None]
        hit, why = _unique(old.group(1), dict.fromkeys(parents), "MIG-enabled GPU")
        return None, f"{hit}/{int(old.group(2))}/{int(old.group(3))}", why
    pool: dict[str, GPUInfo | None] = dict(machine.migs) if kind == "MIG" else machine.gpus
    hit, why = _unique(entry, pool, "MIG device" if kind == "MIG" else "GPU")
    return (pool.get(hit) if why is None else None), hit, why


def _unique(prefix: str, pool: Mapping[str, object], what: str) -> tuple[str, str | None]:
    """The one UUID of ``pool`` that starts with ``prefix``, or why there is not one."""
    hits = [uuid for uuid in pool if uuid.startswith(prefix)]
    if not hits:
        return "", f"names no {what} of this machine"
    if len(hits) > 1:
        return "", f"is ambiguous: the UUIDs of {len(hits)} {what}s start with it"
    return hits[0], None


def _count(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _numbered_by_cuda(
    raw: str, order: str | None, machine: _Machine, entries: list[str], ask_cuda: CudaAnswer
) -> tuple[GPUInfo, ...]:
    """The devices in CUDA's own order, as the driver enumerates them under the caller's
    environment; ValueError naming ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` if it cannot say."""
    uuids, what = ask_cuda()
    if uuids is None:
        names = sorted({g.name or "unknown" for g in machine.whole.values()} | (
            {"MIG devices"} if machine.migs else set()))  # fmt: skip
        setting = "unset (CUDA's default, FASTEST_FIRST)" if order is None else repr(order)
        raise ValueError(
            f"{VISIBLE_VAR}={raw!r} names GPUs by index with {ORDER_VAR} {setting}: CUDA "
            f"numbers them fastest first, nvidia-smi by PCI bus, and on this machine's GPUs "
            f"({', '.join(names)}) the two orders may differ; the CUDA driver could not be "
            f"asked which is which ({what}). Set {ORDER_VAR}={PCI_ORDER} (indexes then mean "
            f"nvidia-smi's), or name the GPUs by UUID (nvidia-smi -L)"
        )
    gpus = []
    for i, body in enumerate(uuids):
        device = machine.by_body(body)
        entry = entries[i] if len(uuids) == len(entries) else None
        if device is None:
            gpus.append(GPUInfo(i, entry or f"GPU-{body}", f"GPU-{body}"))
        else:
            gpus.append(replace(device, index=i, device_id=entry or device.uuid or body))
    return tuple(gpus)


def no_gpu_message(detail: str, caller: str) -> str:
    """Why ``caller`` has no GPU to share: ``detail`` is detection's account of it."""
    return (
        f"{caller}: {detail}. A child given a GPU here would run on one this process was "
        f"denied; unset {VISIBLE_VAR} or list the GPUs to share in it"
    )
