"""Finding the bench/ directory."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hwpool._cli import _bench


def test_installed_benchmarks_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site" / "hwpool" / "_cli"
    (site / _bench.PACKAGED).mkdir(parents=True)
    (site / _bench.PACKAGED / "bench_x.py").write_text("def main():\n    return 'x'\n")
    monkeypatch.setattr(_bench, "__file__", str(site / "_bench.py"))
    assert _bench.find_bench_dir() == site / _bench.PACKAGED
    assert list(_bench.run_benchmarks(site / _bench.PACKAGED)) == ["x"]


def test_a_source_checkout_uses_its_bench_folder() -> None:
    checkout = Path(__file__).resolve().parents[2]
    assert _bench.find_bench_dir() == checkout / "bench"


def test_the_wheel_ships_the_bench_folder_where_the_command_looks() -> None:
    # Before, the benchmarks were only in a source checkout: `hwpool bench` after a wheel
    # install could only fail.
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert shipped["bench"] == f"hwpool/_cli/{_bench.PACKAGED}"
    assert Path(_bench.__file__).parent.name == "_cli"


def test_no_benchmarks_anywhere_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bench, "__file__", str(tmp_path / "a" / "b" / "hwpool" / "_cli" / "x.py"))
    with pytest.raises(_bench.BenchError, match=r"no benchmarks found \(looked in .*benchmarks"):
        _bench.find_bench_dir()


def test_a_benchmark_missing_its_extra_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "bench_np.py").write_text(
        "import hwpool_no_such_module\ndef main():\n    return ''\n"
    )
    with pytest.raises(_bench.BenchError, match=r"bench_np.py needs hwpool_no_such_module: pip"):
        list(_bench.run_benchmarks(tmp_path))


def test_main_must_return_text(tmp_path: Path) -> None:
    (tmp_path / "bench_n.py").write_text("def main():\n    return 3\n")
    with pytest.raises(_bench.BenchError, match="returned int, not a str"):
        list(_bench.run_benchmarks(tmp_path))
    (tmp_path / "bench_n.py").write_text("x = 1\n")
    with pytest.raises(_bench.BenchError, match="has no main"):
        list(_bench.run_benchmarks(tmp_path))


def test_main_taking_argv_gets_an_empty_one_and_its_print_is_not_doubled(
    tmp_path: Path,
) -> None:
    (tmp_path / "bench_argv.py").write_text(
        "def main(argv=None):\n"
        "    assert argv == [], argv\n"
        "    print('warming up')\n"
        "    print('the table')\n"
        "    return 'the table'\n"
    )
    assert list(_bench.run_benchmarks(tmp_path)) == ["warming up\nthe table"]


# What each shipped benchmark's table holds when it ran: its ratio (or verdict) lines. A new
# benchmark must be added here, so that this run covers it too.
SHIPPED = {
    "backfill": ("the liar", "head (estimates)", "3. throughput"),
    "cpu_pool": ("vs TPE", "ThreadPoolExecutor", "CPUPool.run_rows"),
    "fairness": ("one owner", "GPU-time per owner", "us per release"),
    "gpu_pool": ("uncontended acquire+release pair", "contended grants/s", "easy / reserve-all"),
    "jobs": ("hwpool jobs, 100 queued", "< 200 ms for 500", "supervisor RSS, 100 queued"),
    "memory_pool": ("GPUPool(gpu_memory=[80GiB] * 8), MiB", "the same, fractions"),
    "policy": ("== batch:", "(a) hwpool's makespan within", "(c) each stream's 4-GPU task"),
    "policy_realtime": ("first-fit toy", "aim: easy's mean at least"),
    "queue": ("us/task", "1.00x"),
    "ray": ("overhead ratio (hwpool.ray / Ray)", "most load on one GPU"),
    "server": ("hwpool serve: acquire_blocking + release", "memory server vs fraction server"),
    "server_flood": ("during the flood", "max round trip during the flood"),
    "server_load": ("grants/s", "checks: free == total, no lease or waiter left"),
    "sim_scale": ("us per task", "4k/1k"),
    "watch": ("whole watcher step", "% of one core"),
}


def sections(out: str) -> dict[str, str]:
    """``hwpool bench`` output cut at its ``== NAME ==`` headings."""
    found: dict[str, str] = {}
    name = None
    for line in out.splitlines():
        if line.startswith("== ") and line.endswith(" ==") and ":" not in line:
            name = line[3:-3]
            found[name] = ""
        elif name is not None:
            found[name] += line + "\n"
    return found


@pytest.mark.timeout(300)
def test_hwpool_bench_quick_runs_every_shipped_benchmark_end_to_end() -> None:
    # Before, `hwpool bench` stopped at bench_policy_realtime ("unrecognized arguments:
    # bench") and nothing after it ran; there was no --quick.
    checkout = Path(__file__).resolve().parents[2]
    shipped = {path.stem.removeprefix("bench_") for path in (checkout / "bench").glob("bench_*.py")}
    assert shipped == set(SHIPPED), "add the new benchmark to SHIPPED"
    proc = subprocess.run(
        [sys.executable, "-m", "hwpool", "bench", "--quick"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(checkout / "src")},
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    ran = sections(proc.stdout)
    assert list(ran) == sorted(SHIPPED)
    for name, fragments in SHIPPED.items():
        if name == "ray" and importlib.util.find_spec("ray") is None:
            assert "skipped (needs Ray" in ran[name]
            continue
        for fragment in fragments:
            assert fragment in ran[name], f"{name}: no {fragment!r} in\n{ran[name]}"
