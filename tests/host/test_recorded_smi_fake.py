"""The recorded fake nvidia-smi itself: it answers only what the recording holds, as nvidia-smi
formats it (tests/fakes/recorded_smi.py; the capture quoted beside each case)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.recorded_smi import ALL, CAPTURES, H100, RTX_2080_SUPER_WINDOWS, Capture, answer

SHARED = Path(__file__).resolve().parents[3] / "shared" / "realgpu" / "captures"


def test_columns_by_name_in_the_order_asked_with_and_without_units() -> None:
    """H100 load: "memory.total [MiB]" 81559 MiB, "utilization.gpu [%]" 100 %."""
    capture = Capture(H100)
    query = "--query-gpu=utilization.gpu,memory.total"
    assert answer(capture, "load", [query, "--format=csv"]) == (
        "utilization.gpu [%], memory.total [MiB]\n100 %, 81559 MiB\n", 0,
    )  # fmt: skip
    assert answer(capture, "load", [query, "--format=csv,noheader,nounits"]) == ("100, 81559\n", 0)


def test_an_alias_from_the_captures_own_help_and_markers_kept() -> None:
    """``"used_gpu_memory" or "used_memory"`` (--help-query-compute-apps); under WDDM each
    process's memory is ``[N/A]``, which nounits leaves as it is."""
    output, status = answer(
        Capture(RTX_2080_SUPER_WINDOWS), "idle",
        ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
    )  # fmt: skip
    assert status == 0 and output.splitlines()[0] == "2140, [N/A]"


@pytest.mark.parametrize(
    "argv",
    [
        ["--query-gpu=memory.nonsense", "--format=csv"],
        ["--query-gpu=uuid", "--format=json"],
        ["--query-gpu=uuid"],
        ["-q"],
    ],
)
def test_what_the_recording_does_not_hold_is_refused(argv: list[str]) -> None:
    output, status = answer(Capture(H100), "load", argv)
    assert status == 2 and output


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared recordings are not here")
@pytest.mark.parametrize("name", ALL)
def test_the_copies_are_the_recordings_unchanged(name: str) -> None:
    assert (CAPTURES / name).read_bytes() == (SHARED / name).read_bytes()
