"""Finding the bench/ directory."""

from __future__ import annotations

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
    "estimate": ("estimated start minus actual start", "mean|e|"),
    "fairness": ("one owner", "GPU-time per owner", "us per release"),
    "gpu_pool": ("uncontended acquire+release pair", "contended grants/s", "easy / reserve-all"),
    "jobs": ("hwpool jobs, 100 queued", "< 200 ms for 500", "supervisor RSS, 100 queued"),
    "memory_pool": ("GPUPool(gpu_memory=[80GiB] * 8), MiB", "the same, fractions"),
    "policy": ("== batch:", "(a) hwpool's makespan within", "(c) each stream's 4-GPU task"),
    "policy_realtime": ("first-fit toy", "aim: easy's mean at least"),
    "queue": ("us/task", "1.00x"),
    "ray": ("overhead ratio (hwpool.ray / Ray)", "most load on one GPU"),
    "server": ("hwpool serve: acquire_blocking + release", "memory server vs fraction server"),
    "server_cpu": ("bare echo server, per line", "hwpool serve, per acquire + release"),
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


# The benchmarks whose own smoke test runs them (each in a file that names its script); the
# others run in the test below, through `hwpool bench`, which also checks the command's order.
OWN_TEST = {
    "backfill": "cli/test_bench_backfill.py", "cpu_pool": "cli/test_bench_cpu_pool.py",
    "estimate": "cli/test_bench_estimate.py",
    "fairness": "cli/test_bench_fairness.py", "jobs": "cli/test_bench_jobs.py",
    "policy": "cli/test_bench_policy.py", "policy_realtime": "cli/test_bench_policy.py",
    "queue": "cli/test_bench_queue.py", "ray": "ray_pool/test_bench_ray.py",
    "server": "server/test_bench_server.py", "server_flood": "server/test_bench_server.py",
    "server_cpu": "server/test_bench_server.py",
    "server_load": "server/test_bench_server.py", "sim_scale": "cli/test_bench_sim_scale.py",
    "watch": "watch/test_bench_watch.py",
}  # fmt: skip


def test_every_shipped_benchmark_is_run_by_a_test() -> None:
    checkout = Path(__file__).resolve().parents[2]
    shipped = {path.stem.removeprefix("bench_") for path in (checkout / "bench").glob("bench_*.py")}
    assert shipped == set(SHIPPED), "add the new benchmark to SHIPPED"
    for name, test in OWN_TEST.items():
        assert f"bench_{name}" in (checkout / "tests" / test).read_text(), (name, test)


@pytest.mark.timeout(300)
def test_hwpool_bench_quick_runs_the_others_end_to_end() -> None:
    # Before, `hwpool bench` stopped at bench_policy_realtime ("unrecognized arguments:
    # bench") and nothing after it ran; there was no --quick. Those with a smoke test of their
    # own (OWN_TEST) are not run twice: one of them (queue, quick) stands for them here.
    checkout = Path(__file__).resolve().parents[2]
    names = sorted({*SHIPPED} - {*OWN_TEST} | {"queue"})
    proc = subprocess.run(
        [sys.executable, "-m", "hwpool", "bench", "--quick", *names],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(checkout / "src")},
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    ran = sections(proc.stdout)
    assert list(ran) == names
    for name in names:
        for fragment in SHIPPED[name]:
            assert fragment in ran[name], f"{name}: no {fragment!r} in\n{ran[name]}"
