"""Finding the bench/ directory."""

from __future__ import annotations

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
