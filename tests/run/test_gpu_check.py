"""bench/gpu_check.py skips cleanly without a GPU, and with a fake nvidia-smi runs every check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

SCRIPT = str(Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py")
UUIDS = ("GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000")
SMI = f"""case "$1" in
  -L) echo "GPU 0: Fake (UUID: {UUIDS[0]})"; echo "GPU 1: Fake (UUID: {UUIDS[1]})";;
  --query-compute-apps*) ;;
  *) echo "0, {UUIDS[0]}, Fake, 81559, 0, 0"; echo "1, {UUIDS[1]}, Fake, 81559, 0, 0";;
esac
"""


def check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT], capture_output=True, text=True, env=env, timeout=120,
        check=False,
    )  # fmt: skip


def test_without_a_gpu_it_skips(tmp_path: Path) -> None:
    proc = check({"PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "gpu_check: skipped: no GPU found (nvidia-smi not found on PATH)\n"


def test_with_two_fake_gpus_every_child_sees_its_lease(fake_smi: Callable[[str], Path]) -> None:
    fake_smi(SMI)
    proc = check(dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    seen = [r["CUDA_VISIBLE_DEVICES"] for r in reports]
    assert sorted(seen[:2]) == list(UUIDS)  # lease.popen(), one per GPU
    assert sorted(seen[2:6]) == [UUIDS[0], UUIDS[0], UUIDS[1], UUIDS[1]]  # two halves each
    # Children of a server that inherited "1,0": given the UUIDs those entries name.
    assert sorted(seen[6:10]) == [UUIDS[0], UUIDS[0], UUIDS[1], UUIDS[1]]
    refused = [r for r in reports if "hwpool serve exit" in r]  # no visible GPU
    assert [(r["CUDA_VISIBLE_DEVICES"], r["ok"]) for r in refused] == [
        ("", True), ("-1", True), ("NoDevFiles", True)]  # fmt: skip
    assert proc.stdout.rstrip().endswith("every child ran on its lease's GPU")
