"""Imports run one way: CLI -> fronts -> backends -> core. Read from the source, not run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hwpool"

LEAVES = {"_errors", "_check", "_version", "_printable", "_exits"}
# What each part of the package may import of hwpool, besides itself and the leaves.
EVERYTHING = {"*"}
ALLOWED: dict[str, set[str]] = {
    "_errors": set(),
    "_check": set(),
    "_version": set(),
    "_printable": set(),
    "_exits": set(),
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


# ----------------------------------------------------------------- no import cycles
def module_name(path: Path) -> str:
    """``hwpool._gpu._pool`` for ``src/hwpool/_gpu/_pool.py`` (a package by its ``__init__``)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["hwpool", *parts])


MODULES = {module_name(path): path for path in SOURCES}


def top_level_imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """The hwpool modules that ``source`` (the module ``module``) imports at its top level,
    ``if TYPE_CHECKING:`` blocks included (a cycle there is still one for a reader and for
    the type checker); imports inside functions are deferred on purpose and not counted."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    statements = list(ast.parse(source).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.If | ast.Try):
            statements += node.body + node.orelse
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # "from . import x" imports the module x
                inner = f"{target}.{alias.name}"
                found.add(inner if inner in MODULES else target)
    return {name for name in found if name in MODULES and name != module}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others."""
    reach = {name: _reachable(graph, name) for name in graph}
    cycles: list[list[str]] = []
    seen: set[str] = set()
    for name in sorted(graph):
        if name in seen or name not in reach[name]:
            continue
        group = sorted(other for other in reach[name] if name in reach[other])
        seen.update(group)
        cycles.append(group)
    return cycles


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    found: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += graph.get(name, ())
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import cycle at module level (issue 25: ``_gpu/_lease.py`` imported ``GPUPool``
    for its type while ``_gpu/_pool.py`` imports ``GPULease``)."""
    graph = {
        name: top_level_imports(path.read_text(), name, path.name == "__init__.py")
        for name, path in MODULES.items()
    }
    assert import_cycles(graph) == []


def test_the_cycle_checker_sees_a_cycle_behind_type_checking() -> None:
    lease = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._pool import GPUPool\n"
    graph = {
        "hwpool._gpu._lease": top_level_imports(lease, "hwpool._gpu._lease"),
        "hwpool._gpu._pool": top_level_imports(
            "from ._lease import GPULease\n", "hwpool._gpu._pool"
        ),
        "hwpool._gpu._env": top_level_imports(
            "def later() -> None:\n    from ._lease import GPULease\n", "hwpool._gpu._env"
        ),
    }
    assert graph["hwpool._gpu._env"] == set()
    assert import_cycles(graph) == [["hwpool._gpu._lease", "hwpool._gpu._pool"]]


# ----------------------------------------------------------------- the command modules
CLI = PACKAGE / "_cli"
CLI_MODULES = {path.stem: path for path in sorted(CLI.glob("*.py"))}


def cli_imports(source: str) -> set[str]:
    """The ``hwpool._cli`` modules (by file stem) that ``source``, a module of ``_cli``,
    imports anywhere: at its top, inside a function (a lazy import counts: it is a cycle all
    the same once it runs), or by name through a call (``importlib.import_module("._run",
    ...)``, the parser's ``_lazy("._run", ...)``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:
                found.update([module.split(".")[0]] if module else [a.name for a in node.names])
            elif node.level == 0 and module == "hwpool._cli":
                found.update(alias.name for alias in node.names)
            elif node.level == 0 and module.startswith("hwpool._cli."):
                found.add(module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names = alias.name.split(".")
                if names[:2] == ["hwpool", "_cli"] and len(names) > 2:
                    found.add(names[2])
        elif isinstance(node, ast.Call):
            for arg in node.args:
                text = arg.value if isinstance(arg, ast.Constant) else None
                if isinstance(text, str) and text.startswith(".") and text[1:] in CLI_MODULES:
                    found.add(text[1:])
    return found


def is_command_module(source: str) -> bool:
    """Whether ``source`` defines a command: a top-level ``cmd_*`` function or name."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("cmd_"):
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.startswith("cmd_") for t in node.targets
        ):
            return True
    return False


def cli_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    return {name: cli_imports(source) - {name} for name, source in sources.items()}


def commands_importing_commands(sources: dict[str, str]) -> list[str]:
    """``_a imports _b`` for each command module that imports another command module."""
    commands = {name for name, source in sources.items() if is_command_module(source)}
    graph = cli_graph(sources)
    return [
        f"{name} imports {other}"
        for name in sorted(commands)
        for other in sorted(graph[name] & commands)
    ]


CLI_SOURCES = {name: path.read_text() for name, path in CLI_MODULES.items()}


def test_no_command_module_imports_another() -> None:
    """Each command's module imports the shared helpers (``_args``, ``_host_access``,
    ``_job_table``, ...), never another command's module (issue 37)."""
    assert commands_importing_commands(CLI_SOURCES) == []


def test_no_import_cycle_among_the_cli_modules_lazy_ones_included() -> None:
    """No ``_cli`` module imports, even inside a function or by name, one that imports it
    back (issue 37: ``_host_cmds``, ``_jobs_cmds`` and ``_parser`` did)."""
    assert import_cycles(cli_graph(CLI_SOURCES)) == []


def test_the_cli_checkers_see_lazy_imports_and_commands() -> None:
    sources = {
        "_parser": 'from . import _args\nrun = _lazy("._jobs_cmds", "cmd_jobs")\n',
        "_args": "LIMIT = 1\n",
        "_jobs_cmds": "from ._parser import NOTE\ncmd_jobs = guarded(_jobs)\n",
        "_host_cmds": "def cmd_status(args):\n    from ._jobs_cmds import cancel_jobs\n",
        "_serve": "import hwpool._cli._args\ndef cmd_serve(args):\n    return 0\n",
    }
    assert cli_imports(sources["_host_cmds"]) == {"_jobs_cmds"}
    assert cli_imports(sources["_serve"]) == {"_args"}
    assert not is_command_module(sources["_parser"])
    assert commands_importing_commands(sources) == ["_host_cmds imports _jobs_cmds"]
    assert import_cycles(cli_graph(sources)) == [["_jobs_cmds", "_parser"]]
