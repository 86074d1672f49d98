"""The public API: everything in ``hwpool.__all__`` exists, is documented and is typed."""

from __future__ import annotations

import ast
import inspect
import json
import pickle
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import hwpool

LIGHT = ["hwpool", "hwpool._version"]
"""All that ``import hwpool`` may import of the package: the public names load on first use."""


def run_python(code: str, stdin: bytes = b"") -> str:
    """What ``code`` prints in a fresh interpreter (this checkout's hwpool first on the path)."""
    source = str(Path(hwpool.__file__).parents[1])
    result = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {source!r})\n{code}"],
        input=stdin, capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    return result.stdout.decode()


def test_all_is_importable_and_unique() -> None:
    assert len(set(hwpool.__all__)) == len(hwpool.__all__)
    for name in hwpool.__all__:
        assert hasattr(hwpool, name), name


def test_public_objects_are_documented_and_annotated() -> None:
    for name in hwpool.__all__:
        obj = getattr(hwpool, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        assert inspect.getdoc(obj), f"{name} has no docstring"
        members = (
            [obj]
            if inspect.isfunction(obj)
            else [
                member
                for attr, member in vars(obj).items()
                if inspect.isfunction(member)
                and (not attr.startswith("_") or attr == "__init__")
                # typing gives a Protocol an __init__ of its own, which no caller uses
                and not (attr == "__init__" and getattr(obj, "_is_protocol", False))
            ]
        )
        for fn in members:
            sig = inspect.signature(fn)
            assert (
                fn.__name__ == "__init__" or sig.return_annotation is not inspect.Signature.empty
            ), f"{name}.{fn.__name__} lacks a return annotation"
            for param in sig.parameters.values():
                if param.name not in ("self", "cls"):
                    assert param.annotation is not inspect.Parameter.empty, (
                        f"{name}.{fn.__name__}({param.name}) lacks an annotation"
                    )


def test_package_is_marked_typed() -> None:
    assert Path(inspect.getfile(hwpool)).with_name("py.typed").exists()


def test_public_names_live_in_hwpool() -> None:
    for name in hwpool.__all__:
        obj = getattr(hwpool, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == "hwpool", f"{name}.__module__ is {obj.__module__}"


def test_public_classes_pickle_by_their_public_name() -> None:
    assert pickle.loads(pickle.dumps(hwpool.GPUSource.ENV)) is hwpool.GPUSource.ENV
    assert pickle.dumps(hwpool.GPUPool).count(b"hwpool._") == 0


def test_one_version_source() -> None:
    assert hwpool.__version__ == metadata.version("hwpool")


def test_every_numa_result_says_done_and_why() -> None:
    results = [hwpool.NumaBinding(None, (), hwpool.NumaReason.DISABLED)]
    results.append(hwpool.PagePlacement.refused(hwpool.NumaReason.SINGLE_NODE))
    for result in results:
        assert isinstance(result, hwpool.NumaResult) and not result.done
    assert hwpool.BindReason is hwpool.NumaReason  # the 0.1 name
    with hwpool.CPUPool(0) as pool:
        assert isinstance(pool.numa, hwpool.NumaBinder)


def test_importing_hwpool_loads_no_public_module() -> None:
    code = "import hwpool, sys; print(sorted(m for m in sys.modules if m.startswith('hwpool')))"
    assert run_python(code) == f"{LIGHT}\n"
    assert set(hwpool.__all__) <= set(dir(hwpool))


def test_each_public_name_first_used_in_a_fresh_process_lives_in_hwpool() -> None:
    code = """
import inspect, json, hwpool
found = {}
for name in hwpool.__all__:  # each one's first use, loading its module
    obj = getattr(hwpool, name)
    found[name] = obj.__module__ if inspect.isclass(obj) or inspect.isfunction(obj) else None
print(json.dumps(found))
"""
    found = json.loads(run_python(code))
    assert sorted(found) == sorted(hwpool.__all__)
    assert {name: module for name, module in found.items() if module not in (None, "hwpool")} == {}


def test_what_a_pool_hands_out_lives_in_hwpool_without_its_name_looked_up() -> None:
    code = """
from hwpool import GPUPool
pool = GPUPool(1)
lease = pool.lease(0.5)
pool.close()
try:
    pool.lease(0.5).__enter__()
except Exception as exc:
    error = exc
print(type(lease).__module__, type(pool.snapshot()).__module__, type(error).__module__)
"""
    assert run_python(code).split() == ["hwpool", "hwpool", "hwpool"]


def test_a_pickle_of_a_public_object_loads_in_a_process_that_has_not_used_it() -> None:
    code = "import pickle, sys; print(repr(pickle.loads(sys.stdin.buffer.read())))"
    shipped = pickle.dumps((hwpool.GPUSource.ENV, hwpool.GPUPool, hwpool.PoolClosedError))
    assert run_python(code, shipped).strip() == repr(
        (hwpool.GPUSource.ENV, hwpool.GPUPool, hwpool.PoolClosedError)
    )


def test_the_names_types_see_are_the_names_loaded() -> None:
    """The ``if TYPE_CHECKING:`` imports of ``__init__.py`` and its ``_HOMES`` agree."""
    tree = ast.parse(Path(hwpool.__file__).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    typed = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == hwpool._HOMES
    assert sorted([*typed, "__version__"]) == sorted(hwpool.__all__)
