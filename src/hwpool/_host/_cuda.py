"""Which devices the CUDA driver itself enumerates, asked in a short-lived child process.

With ``CUDA_DEVICE_ORDER`` unset (CUDA's default, ``FASTEST_FIRST``) CUDA numbers GPUs by a
speed heuristic, while nvidia-smi and NVML number them by PCI bus: on a machine of different
GPUs an index in ``CUDA_VISIBLE_DEVICES`` can name another card than nvidia-smi's GPU of that
index. Only the driver knows its own order, so this asks it: ``libcuda.so.1`` through ctypes
(``cuInit``, ``cuDeviceGetCount``, ``cuDeviceGet``, ``cuDeviceGetUuid_v2``, else
``cuDeviceGetUuid``), no dependency. It runs in a child process (this file, run as a script
with ``python -I``) so that the caller, a server or a pool's parent, never initialises CUDA:
CUDA would then hold a context and read ``CUDA_VISIBLE_DEVICES`` for good in that process.

The child gets the caller's environment as it is, so it enumerates exactly what CUDA would
enumerate in the caller: the invalid-entry rule, prefixes and MIG devices included.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
from collections.abc import Mapping

__all__ = ["CUDA_LIBRARY", "CUDA_PROBE_TIMEOUT_S", "cuda_devices"]

CUDA_LIBRARY = "libcuda.so.1"
CUDA_PROBE_TIMEOUT_S = 30.0
"""cuInit on a machine of many GPUs without persistence mode can take seconds each."""

_lock = threading.Lock()
_answers: dict[tuple[object, ...], tuple[tuple[str, ...] | None, str]] = {}


def cuda_devices(
    environ: Mapping[str, str], timeout: float = CUDA_PROBE_TIMEOUT_S
) -> tuple[tuple[str, ...] | None, str]:
    """The UUIDs (``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, no ``GPU-``/``MIG-`` prefix: the
    driver gives 16 bytes) of the devices CUDA enumerates under ``environ``, in CUDA's order;
    None when the driver could not be asked, and what happened, in words.

    Cached per process for each environment (a server asks once).
    """
    key = (sys.executable, timeout, *sorted(environ.items()))
    with _lock:
        if key not in _answers:
            _answers[key] = _ask(dict(environ), timeout)
        return _answers[key]


def _ask(environ: dict[str, str], timeout: float) -> tuple[tuple[str, ...] | None, str]:
    argv = [sys.executable, "-I", __file__]
    try:
        proc = subprocess.run(
            argv, env=environ, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"the CUDA driver did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"the CUDA probe could not start: {exc}"
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        return None, f"the CUDA probe failed (exit {proc.returncode}): {proc.stderr.strip()[-200:]}"
    if not isinstance(answer, dict) or "error" in answer:
        return None, str(answer.get("error") if isinstance(answer, dict) else answer)
    uuids = tuple(str(u) for u in answer.get("uuids", ()))
    return uuids, f"the CUDA driver enumerated {len(uuids)} device(s)"


def _probe() -> dict[str, object]:
    """Run in the child: what ``libcuda`` enumerates, as a JSON-ready record."""
    try:
        lib = ctypes.CDLL(CUDA_LIBRARY)
    except OSError as exc:
        return {"error": f"{CUDA_LIBRARY} did not load ({exc})"}
    status = lib.cuInit(0)
    if status == 100:  # CUDA_ERROR_NO_DEVICE: the driver answers "none"
        return {"uuids": []}
    if status != 0:
        return {"error": f"cuInit failed (CUresult {status})"}
    count = ctypes.c_int(0)
    status = lib.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return {"error": f"cuDeviceGetCount failed (CUresult {status})"}
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    uuids = []
    for ordinal in range(count.value):
        device = ctypes.c_int(0)
        raw = (ctypes.c_ubyte * 16)()
        status = lib.cuDeviceGet(ctypes.byref(device), ordinal) or get_uuid(raw, device)
        if status != 0:
            return {"error": f"device {ordinal}: no UUID from the CUDA driver (CUresult {status})"}
        text = bytes(raw).hex()
        uuids.append(f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}")
    return {"uuids": uuids}


if __name__ == "__main__":
    print(json.dumps(_probe()))
