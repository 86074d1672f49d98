"""``hwpool serve`` on a machine where one GPU is lost: the others are served, and the lost
one is named in the server's log and in ``hwpool status`` (the watch's problem).

NVML answers NVML_ERROR_GPU_IS_LOST on that GPU's handle (nvidia-ml-py raises
NVMLError_GpuIsLost), through the file-driven fake NVML (tests/fakes/nvml_file/).
"""

from __future__ import annotations

import os
from pathlib import Path

from fakes.nvml_file import DIRECTORY, gpu, write_state
from hostserver import ENV, SRC, Server, status_of

A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"
LOST = "NVMLError_GpuIsLost: GPU is lost"


def test_a_lost_gpu_is_left_out_named_and_the_other_served(sockdir: Path) -> None:
    """Before: NVML failed as a whole at detection, and every sample of the watch failed
    ("NVML failed (...)"), so no GPU was read at all."""
    state = sockdir / "nvml.json"
    write_state(state, [
        gpu(A, 16384, used_mib=0, utilization=5),
        gpu(B, 16384, failing={"nvmlDeviceGetHandleByIndex": "GpuIsLost"}),
    ])  # fmt: skip
    env = {k: v for k, v in ENV.items() if k not in ("HWPOOL_NUM_GPUS", "CUDA_VISIBLE_DEVICES")}
    env.update(PYTHONPATH=f"{DIRECTORY}{os.pathsep}{SRC}", HWPOOL_FAKE_NVML=str(state))
    server = Server(sockdir / "s.sock", "--memory", "--watch-interval", "0.05", env=env)
    try:
        server.ready()
        assert "serving 1 GPU" in server.wait_for("serving")
        server.wait_for(f"left out device 1: {LOST}")
        server.wait_for(f"GPU watch: device 1: {LOST}")
        status = status_of(sockdir / "s.sock")
        assert [g["uuid"] for g in status["gpus"]] == [A]
        assert status["watch"]["problem"] == f"device 1: {LOST}"
        assert status["gpus"][0]["live"]["utilization"] == 5  # the other GPU is read
    finally:
        server.kill()
