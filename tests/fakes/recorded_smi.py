"""A fake ``nvidia-smi`` that answers from a real machine's recording.

The recordings in ``captures/`` are whole nvidia-smi sessions taken on real machines (H100,
H100 and H200 in MIG mode, H200, L40S, RTX 4080 SUPER, RTX 2080 SUPER under Windows), copied
unchanged from utkuozdemir/nvidia_gpu_exporter ``internal/captures/`` (MIT licence); see
../shared/realgpu/README.md. Each holds ``--version``, ``-L``, the help texts, and per phase
(``idle``, ``load``) the full ``--query-gpu`` and ``--query-compute-apps`` CSVs with headers.

:func:`install` puts a small ``nvidia-smi`` script first in a directory; it runs this file,
which answers what hwpool asks (``--query-gpu=...``, ``--query-compute-apps=...``,
``--format=csv[,noheader][,nounits]``, ``-L``, ``--version``, and no argument: the default
table, where the phase has one) from the recording:

- the columns asked for are picked out of the recorded CSV by header name, in the order
  asked; a name is also found through its alias where the capture's own help text lists one
  (``"used_gpu_memory" or "used_memory"``); a field the recording lacks is refused as
  nvidia-smi refuses an unknown field (exit 2);
- ``nounits`` removes a value's unit only where the header names one (``memory.total [MiB]``:
  ``81559 MiB`` -> ``81559``); markers such as ``[N/A]`` stay as they are;
- anything else is an invalid argument (exit 2, as nvidia-smi documents).

Nothing is made up: every value printed is in the recording.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

CAPTURES = Path(__file__).resolve().parent / "captures"

H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H100_MIG = "linux-x86_64__nvidia-h100-mig__590.48.01.txt"
H200 = "linux-x86_64__nvidia-h200__590.48.01.txt"
H200_MIG = "linux-x86_64__nvidia-h200-mig__590.48.01.txt"
L40S = "linux-x86_64__nvidia-l40s__595.80.txt"
RTX_4080_SUPER = "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt"
RTX_2080_SUPER_WINDOWS = "windows-x86_64__nvidia-geforce-rtx-2080-super__610.62.txt"
ALL = (H100, H100_MIG, H200, H200_MIG, L40S, RTX_4080_SUPER, RTX_2080_SUPER_WINDOWS)

_RULE = "#" * 80
_ALIASES = re.compile(r'"([^"]+)"(?: or "([^"]+)")*')
_UNIT = re.compile(r"(.*?) \[(.+)\]")


def sections(text: str) -> dict[str, str]:
    """The capture's sections by title (``idle :: query-gpu (csv, ...)``): the text between
    the rule under the title block and the next rule, trailing blank lines removed."""
    lines = text.split("\n")
    found: dict[str, str] = {}
    i = 0
    while i < len(lines) - 1:
        if lines[i] == _RULE and " :: " in lines[i + 1]:
            title = lines[i + 1].removeprefix("# ")
            start = lines.index(_RULE, i + 1) + 1
            end = start
            while end < len(lines) and lines[end] != _RULE:
                end += 1
            found[title] = "\n".join(lines[start:end]).rstrip("\n")
            i = end
        else:
            i += 1
    return found


@dataclass(frozen=True)
class Table:
    """One recorded CSV: its header names (unit apart) and units, and its rows."""

    names: tuple[str, ...]
    units: tuple[str | None, ...]
    rows: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, text: str) -> Table:
        lines = [line for line in text.split("\n") if line.strip()]
        names, units = [], []
        for field in lines[0].split(", "):
            unit = _UNIT.fullmatch(field)
            names.append(unit.group(1) if unit else field)
            units.append(unit.group(2) if unit else None)
        rows = tuple(tuple(line.split(", ")) for line in lines[1:])
        assert all(len(row) == len(names) for row in rows), "a recorded row of another width"
        return cls(tuple(names), tuple(units), rows)


class Capture:
    """One recording, read from ``captures/``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = CAPTURES / name
        self.sections = sections(self.path.read_text(encoding="utf-8"))

    def section(self, prefix: str) -> str:
        """The one section whose title starts with ``prefix``."""
        (title,) = [t for t in self.sections if t.startswith(prefix)]
        return self.sections[title]

    def gpus(self, phase: str) -> Table:
        return Table.parse(self.section(f"{phase} :: query-gpu"))

    def apps(self, phase: str) -> Table:
        return Table.parse(self.section(f"{phase} :: query-compute-apps"))

    def aliases(self, switch: str) -> dict[str, tuple[str, ...]]:
        """Every field name the help for ``switch`` (``query-gpu``) lists, with its aliases."""
        names: dict[str, tuple[str, ...]] = {}
        for line in self.section(f"capabilities :: help-{switch}").split("\n"):
            if _ALIASES.fullmatch(line):
                group = tuple(re.findall(r'"([^"]+)"', line))
                for name in group:
                    names[name] = group
        return names

    def value(self, phase: str, column: str, row: int = 0) -> str:
        """One recorded query-gpu value as printed (units and all), for a test's expectation."""
        table = self.gpus(phase)
        return table.rows[row][table.names.index(column)]


def answer(capture: Capture, phase: str, argv: list[str]) -> tuple[str, int]:
    """What nvidia-smi run with ``argv`` prints on the recorded machine, and its exit status."""
    if argv == ["--version"]:
        return capture.section("capabilities :: version") + "\n", 0
    if argv == [] and any(
        t.startswith(f"{phase} :: nvidia-smi (default") for t in capture.sections
    ):
        return capture.section(f"{phase} :: nvidia-smi (default table)") + "\n", 0
    if argv == ["-L"]:
        return capture.section("capabilities :: list (-L)") + "\n", 0
    query = [a for a in argv if a.startswith(("--query-gpu=", "--query-compute-apps="))]
    formats = [a for a in argv if a.startswith("--format=")]
    if len(query) != 1 or len(formats) != 1 or len(argv) != 2:
        return "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2
    switch, _, fields = query[0].removeprefix("--").partition("=")
    options = formats[0].removeprefix("--format=").split(",")
    if options[0] != "csv" or not set(options[1:]) <= {"noheader", "nounits"}:
        return f'"{formats[0]}" is not a valid format.\n', 2
    table = capture.gpus(phase) if switch == "query-gpu" else capture.apps(phase)
    return _select(table, capture.aliases(switch), fields.split(","), options)


def _select(
    table: Table, aliases: dict[str, tuple[str, ...]], fields: list[str], options: list[str]
) -> tuple[str, int]:
    columns = []
    for field in fields:
        names = aliases.get(field, (field,))
        hits = [i for i, name in enumerate(table.names) if name in names]
        if not hits:
            return f'Field "{field}" is not a valid field to query.\n\n', 2
        columns.append(hits[0])
    lines = []
    if "noheader" not in options:
        lines.append(", ".join(_header(table, i, "nounits" in options) for i in columns))
    for row in table.rows:
        lines.append(", ".join(_cell(table, row, i, "nounits" in options) for i in columns))
    return "".join(f"{line}\n" for line in lines), 0


def _header(table: Table, i: int, nounits: bool) -> str:
    unit = table.units[i]
    return table.names[i] if unit is None or nounits else f"{table.names[i]} [{unit}]"


def _cell(table: Table, row: tuple[str, ...], i: int, nounits: bool) -> str:
    """A value, with its unit removed for ``nounits`` where the header names one."""
    value, unit = row[i], table.units[i]
    if nounits and unit is not None and value.endswith(f" {unit}"):
        return value.removesuffix(f" {unit}")
    return value


def install(directory: Path, capture: str, phase: str = "load", *, log: Path | None = None) -> Path:
    """Write ``directory/nvidia-smi``, answering from ``capture`` (a file name in
    ``captures/``) as in ``phase`` (``idle`` or ``load``); ``log``: a file each call appends
    its arguments to. Returns the script's path."""
    assert (CAPTURES / capture).is_file(), capture
    exe = directory / "nvidia-smi"
    logging = f'echo "$@" >> "{log}"\n' if log else ""
    exe.write_text(
        f'#!/bin/sh\n{logging}exec "{sys.executable}" "{__file__}" "{capture}" "{phase}" "$@"\n'
    )
    exe.chmod(0o755)
    return exe


def main(argv: list[str]) -> int:
    capture, phase, *args = argv
    output, status = answer(Capture(capture), phase, args)
    sys.stdout.write(output)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
