"""Imports run one way: CLI -> fronts -> backends -> core. Read from the source, not run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hwpool"

LEAVES = {"_errors", "_check", "_version", "_printable"}
# What each part of the package may import of hwpool, besides itself and the leaves.
EVERYTHING = {"*"}
ALLOWED: dict[str, set[str]] = {
    "_errors": set(),
    "_check": set(),
    "_version": set(),
    "_printable": set(),
    "_core": set(),
    "_host": set(),
    "_sim": {"_core"},
    "_numa": {"_host"},
    "_cpu": {"_host", "_numa"},
    # The wire protocol and the socket paths sit below both ends of the socket: the unix
    # backend (the client) and the server share them, and neither imports the other.
    "_wire": {"_core", "_host"},
    "_backends": {"_core", "_host", "_wire"},
    "_gpu": {"_core", "_host", "_backends"},
    # The GPU watcher (live sampling, pid-to-lease mapping): below the server, over _host.
    "_watch": {"_host"},
    "_server": {"_core", "_host", "_wire", "_watch"},
    # The per-user job table and supervisor: a client of the server like any other (a front).
    "_jobs": {"_core", "_host", "_wire", "_backends", "_gpu"},
    "ray": {"_core", "_host", "_backends", "_gpu"},
    "_cli": EVERYTHING,
    "__init__": EVERYTHING,
    "__main__": {"_cli"},
}
CLI_USERS = {"_cli", "__main__"}  # nothing else imports the command
# Standard modules that the pure core must not touch: no I/O, no clock, no threads.
CORE_FORBIDDEN = {"asyncio", "threading", "time", "os", "socket", "subprocess", "signal", "select"}


def imports(source: str, location: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """The hwpool parts and the outside top-level modules imported by ``source``.

    ``location`` is the module's path inside the package, e.g. ``("_core", "_scheduler.py")``.
    """
    here = location[:-1]
    parts: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names = alias.name.split(".")
                if names[0] != "hwpool":
                    outside.add(names[0])
                else:
                    parts.add(names[1] if len(names) > 1 else "__init__")
        elif isinstance(node, ast.ImportFrom):
            module = node.module.split(".") if node.module else []
            if node.level == 0 and module[0] != "hwpool":
                outside.add(module[0])
                continue
            if node.level == 0:
                target = module[1:]
            else:
                target = list(here[: len(here) - (node.level - 1)]) + module
            if target:
                parts.add(target[0])
            else:  # "from hwpool import x" or "from . import x" at the top of the package
                parts.update(alias.name for alias in node.names)
    return parts, outside


def violations(source: str, location: tuple[str, ...]) -> list[str]:
    """What ``source``, at ``location`` in the package, imports against the layer map."""
    part = location[0] if len(location) > 1 else location[0].removesuffix(".py")
    if part not in ALLOWED:
        return [f"{part} is not in the layer map of tests/test_layers.py"]
    parts, outside = imports(source, location)
    found = []
    for imported in sorted(parts - {part} - LEAVES):
        if imported == "_cli" and part not in CLI_USERS:
            found.append(f"imports the CLI ({imported})")
        elif ALLOWED[part] is not EVERYTHING and imported not in ALLOWED[part]:
            found.append(f"{part} imports {imported}")
    if part == "_core" and outside & CORE_FORBIDDEN:
        found.append(f"the core imports {sorted(outside & CORE_FORBIDDEN)}")
    if part != "ray" and "ray" in outside:
        found.append(f"{part} imports ray")
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path) -> None:
    assert violations(path.read_text(), path.relative_to(PACKAGE).parts) == []


@pytest.mark.parametrize(
    ("source", "location", "expected"),
    [
        ("from .._gpu._pool import GPUPool\n", ("_core", "_x.py"), ["_core imports _gpu"]),
        ("import asyncio\n", ("_core", "_x.py"), ["the core imports ['asyncio']"]),
        ("from hwpool._cli import main\n", ("_gpu", "_x.py"), ["imports the CLI (_cli)"]),
        ("from ._cli import main\n", ("__init__.py",), ["imports the CLI (_cli)"]),
        ("from .._gpu import _pool\n", ("_sim", "_x.py"), ["_sim imports _gpu"]),
        ("from .._core import _memory\n", ("_watch", "_x.py"), ["_watch imports _core"]),
        ("import ray\n", ("_backends", "_x.py"), ["_backends imports ray"]),
        ("from .._core._capacity import UNITS_PER_GPU\n", ("_gpu", "_x.py"), []),
        (
            "from ._scheduler import Demand\nfrom .._check import check_int\n",
            ("_core", "_x.py"),
            [],
        ),
    ],
)
def test_the_checker_sees_violations(
    source: str, location: tuple[str, ...], expected: list[str]
) -> None:
    assert violations(source, location) == expected
