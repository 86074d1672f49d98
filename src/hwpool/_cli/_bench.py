"""``hwpool bench``: find the benchmark scripts of a source checkout and run them.

Benchmarks live in ``bench/bench_*.py`` of a checkout, not in the wheel. Each module has a
``main() -> str`` (or ``main(argv) -> str``, then called with ``[]``) that runs it and returns
its table; what it prints is captured, and shown only where it is more than that table.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["BenchError", "find_bench_dir", "run_benchmarks"]


class BenchError(RuntimeError):
    """No benchmarks to run, or one of them failed."""


def find_bench_dir() -> Path:
    """``./bench`` if it holds benchmarks, else the ``bench/`` of the checkout this runs from."""
    here = Path(__file__).resolve().parents[3] / "bench"
    candidates = list(dict.fromkeys([Path.cwd() / "bench", here]))
    for candidate in candidates:
        if any(candidate.glob("bench_*.py")):
            return candidate
    raise BenchError(
        "no bench/ directory with bench_*.py found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); the benchmarks ship with a source checkout of hwpool, not with the installed "
        "package: run `hwpool bench` from the checkout or pass --dir"
    )


def _scripts(directory: Path, names: Sequence[str]) -> list[Path]:
    scripts = sorted(directory.glob("bench_*.py"))
    if not scripts:
        raise BenchError(f"no bench_*.py in {str(directory)!r}")
    if not names:
        return scripts
    by_name = {path.stem.removeprefix("bench_"): path for path in scripts}
    unknown = [name for name in names if name.removeprefix("bench_") not in by_name]
    if unknown:
        have = ", ".join(sorted(by_name))
        raise BenchError(f"no benchmark {unknown[0]!r} in {str(directory)!r} (have: {have})")
    return [by_name[name.removeprefix("bench_")] for name in names]


def run_benchmarks(directory: Path, names: Sequence[str] = ()) -> Iterator[str]:
    """Run the chosen benchmarks of ``directory`` in order, yielding each one's table."""
    for script in _scripts(directory, names):
        yield _run_one(script)


def _run_one(script: Path) -> str:
    spec = importlib.util.spec_from_file_location(f"_hwpool_bench_{script.stem}", script)
    if spec is None or spec.loader is None:
        raise BenchError(f"cannot load {str(script)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(script.parent))  # benchmarks may share helpers in bench/
    try:
        spec.loader.exec_module(module)
        entry = getattr(module, "main", None)
        if not callable(entry):
            raise BenchError(f"{script.name} has no main() function")
        table, printed = _call_main(entry)
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(f"{script.name} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(script.parent))
    if not isinstance(table, str):
        raise BenchError(f"{script.name}: main() returned {type(table).__name__}, not a str")
    extra = printed.replace(table, "", 1).strip()  # what main() printed besides its table
    return f"{extra}\n{table}" if extra else table


def _call_main(entry: Callable[..., object]) -> tuple[object, str]:
    """Call a benchmark's ``main``, with an empty argv if it takes one (so that it does not
    parse hwpool's own arguments); return its result and what it printed."""
    takes_argv = bool(inspect.signature(entry).parameters)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        result = entry([]) if takes_argv else entry()
    return result, printed.getvalue()
