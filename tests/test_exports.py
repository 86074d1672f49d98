"""The public API: everything in ``hwpool.__all__`` exists, is documented and is typed."""

from __future__ import annotations

import inspect
import pickle
from importlib import metadata
from pathlib import Path

import hwpool


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
