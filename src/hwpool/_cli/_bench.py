"""``hwpool bench``: find the benchmark scripts and run them.

The benchmarks are the ``bench/bench_*.py`` scripts of the source tree; the wheel ships them
as ``hwpool/_cli/benchmarks`` (see ``force-include`` in pyproject.toml), so that whoever
installed the package can measure their own machine. Each module has a ``main(argv) -> str``
that runs it and returns its table: it is called with ``[]``, or ``["--quick"]`` for its
smallest setting (a smoke run), and never parses ``hwpool``'s own command line. (A ``main()``
without an argv, in a folder given with ``--dir``, is called without one.) What it prints is
captured, and shown only where it is more than that table.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = [
    "PACKAGED",
    "QUICK",
    "BenchError",
    "find_bench_dir",
    "find_scripts",
    "run_benchmarks",
    "run_one",
]

PACKAGED = "benchmarks"
"""Where an installed wheel holds the benchmarks, beside this module."""
QUICK = "--quick"
"""The argument that asks a benchmark for its smallest setting."""


class BenchError(RuntimeError):
    """No benchmarks to run, or one of them failed."""


def find_bench_dir() -> Path:
    """The benchmarks installed with the package, else the ``bench/`` of the source checkout
    this module runs from (an editable install)."""
    here = Path(__file__).resolve()
    candidates = [here.parent / PACKAGED, here.parents[3] / "bench"]
    for candidate in candidates:
        if any(candidate.glob("bench_*.py")):
            return candidate
    raise BenchError(
        "no benchmarks found (looked in "
        + ", ".join(str(c) for c in candidates)
        + "); reinstall hwpool, or pass --dir with a folder of bench_*.py"
    )


def find_scripts(directory: Path, names: Sequence[str] = ()) -> list[Path]:
    """The ``bench_*.py`` of ``directory`` (only those ``names``, in their order, if given;
    a name may omit the ``bench_`` prefix)."""
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


def run_benchmarks(
    directory: Path, names: Sequence[str] = (), *, quick: bool = False
) -> Iterator[str]:
    """Run the chosen benchmarks of ``directory`` in order, yielding each one's table; the
    first that fails raises :class:`BenchError`."""
    for script in find_scripts(directory, names):
        yield run_one(script, quick=quick)


def run_one(script: Path, *, quick: bool = False) -> str:
    """Run one benchmark script's ``main`` and return its table (what it printed besides the
    table first); :class:`BenchError` says which script failed and how."""
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
        table, printed = _call_main(entry, script, quick)
    except BenchError:
        raise
    except SystemExit as exc:  # argparse's error(), or a script's own sys.exit()
        raise BenchError(f"{script.name} exited with status {exc.code}") from exc
    except ModuleNotFoundError as exc:  # numpy, threadpoolctl: the `bench` extra
        raise BenchError(f"{script.name} needs {exc.name}: pip install 'hwpool[bench]'") from exc
    except Exception as exc:
        raise BenchError(f"{script.name} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(script.parent))
    if not isinstance(table, str):
        raise BenchError(f"{script.name}: main() returned {type(table).__name__}, not a str")
    extra = printed.replace(table, "", 1).strip()  # what main() printed besides its table
    return f"{extra}\n{table}" if extra else table


def _call_main(entry: Callable[..., object], script: Path, quick: bool) -> tuple[object, str]:
    """Call a benchmark's ``main`` with its own argv (empty, or ``--quick``) if it takes one;
    ``sys.argv`` reads as that script's own command line meanwhile, so that a ``main`` that
    parses it does not see hwpool's arguments. Return its result and what it printed."""
    takes_argv = bool(inspect.signature(entry).parameters)
    argv = [QUICK] if quick else []
    saved = sys.argv
    sys.argv = [str(script), *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            result = entry(argv) if takes_argv else entry()
    finally:
        sys.argv = saved
    return result, printed.getvalue()
