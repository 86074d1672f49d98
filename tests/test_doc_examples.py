"""Every Python example of README.md and docs/*.md runs, or is marked with the test that runs it.

The marker convention is in tests/docblocks.py. A block with no marker is run here as a user
would run a file holding it: in a fresh interpreter with this checkout's src/ first on the path,
in a temporary folder, with a home, runtime and state directory of its own and a fake machine
of four GPUs (``CUDA_VISIBLE_DEVICES`` with four UUIDs, no nvidia-smi); it must exit 0 within
the timeout. A block marked ``server`` runs the same way beside a real ``hwpool serve --gpus 4``
on a temporary socket, named by ``HWPOOL_SOCKET``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hermetic
from docblocks import KINDS, PYTHON_TAGS, ROOT, Block, all_blocks, python_blocks, stray_markers
from hostserver import running_server

BLOCK_TIMEOUT = 60.0  # seconds a block may run
FAKE_GPUS = ",".join(f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(4))
BLOCKS = python_blocks()
RUN = [b for b in BLOCKS if b.kind in {"run", "server"}]


def _environment(folder: Path) -> dict[str, str]:
    """A clean environment: nothing of the caller's hwpool, CUDA or XDG variables leaks in."""
    runtime = folder / "runtime"
    runtime.mkdir(mode=0o700)
    return {
        **hermetic.machine(),
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_STATE_HOME": str(folder / "state"),
        "PYTHONPATH": str(ROOT / "src"),
        "CUDA_VISIBLE_DEVICES": FAKE_GPUS,
        "LANG": "C.UTF-8",
    }


def _run(block: Block, folder: Path, extra: dict[str, str]) -> None:
    script = folder / "example.py"
    script.write_text(block.code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env={**_environment(folder), **extra},
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{block}: the example exits {proc.returncode}; run it, or mark it "
        f"(see tests/docblocks.py):\n{proc.stderr}"
    )


@pytest.mark.timeout(BLOCK_TIMEOUT + 30)
@pytest.mark.parametrize("block", RUN, ids=str)
def test_the_example_runs(block: Block, tmp_path: Path) -> None:
    if block.kind == "run":
        _run(block, tmp_path, {})
        return
    with running_server("--gpus", "4") as server:
        _run(block, tmp_path, {"HWPOOL_SOCKET": str(server.socket)})


def test_every_python_block_is_run_or_marked_with_what_covers_it() -> None:
    assert len(RUN) >= 4  # the parsing still finds the blocks
    for block in BLOCKS:
        assert block.kind in KINDS, f"{block}: unknown marker kind {block.kind!r} (see {KINDS})"
        if block.kind == "fragment":
            assert block.argument.strip(), (
                f"{block}: a fragment says why: <!-- example: fragment: REASON -->"
            )
        if block.kind == "tested-by":
            test = ROOT / block.argument
            assert test.is_file(), f"{block}: no test {block.argument}"
            assert "blocks_tested_by(__file__)" in test.read_text(), (
                f"{block}: {block.argument} does not ask for its blocks with "
                "docblocks.blocks_tested_by(__file__)"
            )


def test_a_copy_is_the_text_of_a_covered_block() -> None:
    for block in (b for b in BLOCKS if b.kind == "copy-of"):
        originals = [b for b in BLOCKS if b.page == block.argument and b.code == block.code]
        assert originals, f"{block}: no block of {block.argument} has this text"
        assert all(b.kind not in {"copy-of", "fragment"} for b in originals), (
            f"{block}: its original is not run or tested"
        )


def test_no_python_block_hides_under_another_tag_and_no_marker_is_stray() -> None:
    hidden = [str(b) for b in all_blocks() if b.language in PYTHON_TAGS]
    assert hidden == [], f"tag these ```python, so that they are run or marked: {hidden}"
    assert stray_markers() == []
