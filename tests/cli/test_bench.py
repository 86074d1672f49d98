"""Finding the bench/ directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwpool._cli import _bench


def test_bench_dir_is_found_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench_x.py").write_text("def main():\n    return 'x'\n")
    monkeypatch.chdir(tmp_path)
    assert _bench.find_bench_dir() == tmp_path / "bench"
    assert list(_bench.run_benchmarks(tmp_path / "bench")) == ["x"]


def test_no_bench_dir_explains_that_wheels_lack_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_bench, "__file__", str(tmp_path / "site" / "hwpool" / "_bench.py"))
    with pytest.raises(_bench.BenchError, match="not with the installed package"):
        _bench.find_bench_dir()


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
