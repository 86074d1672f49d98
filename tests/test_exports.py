"""The public API: everything in ``hwpool.__all__`` exists, is documented and is typed."""

from __future__ import annotations

import inspect
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
                if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__")
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
