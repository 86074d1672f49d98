"""What to do about a driver failure: the fix for each message NVML or nvidia-smi gives.

Matched on the words NVML (its ``NVML_ERROR_*`` texts, nvidia-ml-py's class names) and
nvidia-smi (its own messages, quoted in docs/gpus.md) print, in order; the first match gives
the fix. A message that matches none has no fix to offer (None): it is shown as it is.
"""

from __future__ import annotations

__all__ = ["fix_for"]

_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("driver/library version mismatch", "libRmVersionMismatch", "nvml/rm version mismatch"),
        "the loaded kernel module is older than the driver's libraries (an upgrade without a "
        "reboot): reboot, or unload and reload the nvidia kernel modules",
    ),
    (
        ("couldn't communicate with the nvidia driver", "driver not loaded", "DriverNotLoaded"),
        "the nvidia kernel module is not loaded: install the driver or load it (modprobe "
        "nvidia); in a container, start it with the GPUs (docker --gpus, the NVIDIA container "
        "toolkit)",
    ),
    (
        ("no devices were found",),
        "the driver sees no GPU: check that one is there (lspci | grep -i nvidia) and the "
        "kernel log (dmesg) for why the driver did not take it",
    ),
    (
        ("gpu is lost", "GpuIsLost", "fallen off the bus"),
        "the GPU fell off the bus (the kernel log shows an Xid 79): reboot, or reset it "
        "(nvidia-smi -r -i N) once nothing runs on it; the other GPUs are served meanwhile",
    ),
    (
        ("requires restart", "ResetRequired"),
        "the GPU needs a reset: nvidia-smi -r -i N once nothing runs on it, or reboot",
    ),
    (
        ("insufficient external power", "insufficiently powered", "InsufficientPower"),
        "check the GPU's power cables are attached and seated",
    ),
    (
        ("insufficient permissions", "NoPermission"),
        "run as root, or give this user access to /dev/nvidia* (the driver's permissions); "
        "in MIG mode a user can read the MIG devices only",
    ),
    (
        ("timed out",),
        "nvidia-smi hung: the driver may be stuck (see dmesg); turning on persistence mode "
        "(nvidia-smi -pm 1, or the nvidia-persistenced service) makes it answer faster",
    ),
    (
        ("not found on path",),
        "install the NVIDIA driver's utilities (nvidia-smi), or NVML's Python binding: pip "
        "install 'hwpool[nvml]'",
    ),
    (
        ("pynvml not installed",),
        "pip install 'hwpool[nvml]' to read the GPUs in-process (exact MIG sizes, no "
        "subprocess per reading)",
    ),
    (
        ("unknown error", "NVMLError_Unknown"),
        "look in the kernel log (dmesg) for Xid errors on this GPU; a reset or a reboot "
        "usually recovers it",
    ),
)


def fix_for(message: str) -> str | None:
    """The fix for a failure reported as ``message``; None where none is known."""
    said = message.lower()
    for words, fix in _FIXES:
        if any(word.lower() in said for word in words):
            return fix
    return None
