"""``hwpool info``: what the library detects on this machine, and from where.

:func:`gather` builds one JSON-ready dict (the ``--json`` output); :func:`format_info` renders
the same dict as text, so the two can never disagree.
"""

from __future__ import annotations

from typing import Any

from ._detect import GPUDetection, detect_gpus

__all__ = ["format_info", "gather"]


def gather() -> dict[str, Any]:
    """Everything ``hwpool info`` reports, as plain JSON types."""
    return {"gpus": _gpus_json(detect_gpus())}


def _gpus_json(found: GPUDetection) -> dict[str, Any]:
    return {
        "count": found.count,
        "source": str(found.source),
        "detail": found.detail,
        "devices": [
            {
                "index": gpu.index,
                "device_id": gpu.device_id,
                "uuid": gpu.uuid,
                "memory_mib": gpu.memory_mib,
            }
            for gpu in found.gpus
        ],
    }


def format_info(info: dict[str, Any]) -> str:
    """The text form of :func:`gather`'s dict."""
    return "\n".join(_gpu_lines(info["gpus"]))


def _gpu_lines(gpus: dict[str, Any]) -> list[str]:
    lines = [f"GPUs: {gpus['count']} (source: {gpus['source']}; {gpus['detail']})"]
    for dev in gpus["devices"]:
        extra = []
        if dev["uuid"]:
            extra.append(dev["uuid"])
        if dev["memory_mib"] is not None:
            extra.append(f"{dev['memory_mib']} MiB")
        suffix = f" ({', '.join(extra)})" if extra else ""
        lines.append(f"  GPU {dev['index']}: device {dev['device_id']}{suffix}")
    return lines
