"""A fake ``nvidia-smi`` that answers hwpool's queries from a real recording (MIG captures).

The captures in ``tests/fakes/captures/`` are copied unchanged from
``../shared/realgpu/captures/`` (nvidia_gpu_exporter's recordings, MIT licence): whole
nvidia-smi sessions of a real machine, idle and under load. :func:`capture_smi` gives the
body of a fake ``nvidia-smi`` (for the ``fake_smi`` fixture) that prints, for the phase asked
(``idle`` or ``load``):

- ``-L``: the recorded list;
- no argument: the recorded default table (with its "MIG devices" and "Processes" sections);
- ``--query-gpu=F,...`` and ``--query-compute-apps=F,...``: the recorded CSV's columns ``F``
  (``used_memory`` is the recorded ``used_gpu_memory``), with ``noheader`` and ``nounits``;
- ``--version``: the recorded version.

Anything else exits 2. Run as a script it is that fake (``capture phase args...``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

CAPTURES = Path(__file__).parent / "captures"
H200_MIG = CAPTURES / "linux-x86_64__nvidia-h200-mig__590.48.01.txt"
H100_MIG = CAPTURES / "linux-x86_64__nvidia-h100-mig__590.48.01.txt"

_HEADER = re.compile(r"^# (\w+) :: (.+)\n# \$ nvidia-smi ?(.*)\n#+\n", re.MULTILINE)
_ALIASES = {"used_memory": "used_gpu_memory", "name": "process_name"}


def sections(capture: Path) -> dict[tuple[str, str], str]:
    """The capture's recorded outputs by (phase, nvidia-smi arguments as recorded)."""
    text = capture.read_text()
    marks = list(_HEADER.finditer(text))
    found: dict[tuple[str, str], str] = {}
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        end = following.start() if following is not None else len(text)
        body = text[mark.end() : end]
        body = body[: body.rfind("\n####")] if "\n####" in body else body
        found[mark.group(1), mark.group(3).strip()] = body.strip("\n") + "\n"
    return found


def _recorded(found: dict[tuple[str, str], str], phase: str, prefix: str) -> str:
    for (where, args), body in found.items():
        if args.startswith(prefix) and where in (phase, "capabilities"):
            return body
    raise KeyError(prefix)


def _csv(recorded: str, fields: list[str], formats: set[str]) -> str:
    """The columns ``fields`` of a recorded CSV (header with units), as nvidia-smi prints
    them with ``formats`` (``noheader``, ``nounits``)."""
    lines = [line for line in recorded.splitlines() if line.strip()]
    header = [h.strip() for h in lines[0].split(", ")]
    names = [re.sub(r" \[.*\]$", "", h) for h in header]
    columns = [names.index(f if f in names else _ALIASES.get(f, f)) for f in fields]
    out = [] if "noheader" in formats else [", ".join(header[c] for c in columns)]
    for line in lines[1:]:
        values = line.split(", ")
        picked = [values[c].strip() for c in columns]
        if "nounits" in formats:
            picked = [re.sub(r"^([0-9.]+) (MiB|%|W|MHz)$", r"\1", v) for v in picked]
        out.append(", ".join(picked))
    return "".join(f"{line}\n" for line in out)


def answer(capture: Path, phase: str, argv: list[str]) -> tuple[int, str]:
    """Exit status and stdout of nvidia-smi ``argv`` as ``capture`` recorded it."""
    found = sections(capture)
    if not argv:
        return 0, found[phase, ""]
    if argv in (["-L"], ["--version"]):
        return 0, _recorded(found, phase, argv[0])
    query = next((a for a in argv if a.startswith("--query-")), None)
    formats = next((a for a in argv if a.startswith("--format=")), "--format=csv")
    if query is None:
        return 2, ""
    kind, fields = query.split("=", 1)
    recorded = _recorded(found, phase, kind + "=")
    return 0, _csv(recorded, fields.split(","), set(formats.split("=", 1)[1].split(",")))


def capture_smi(capture: Path, phase: str = "load") -> str:
    """The body of a fake ``nvidia-smi`` (after ``#!/bin/sh``) answering from ``capture``."""
    return f'exec "{sys.executable}" "{Path(__file__)}" "{capture}" {phase} "$@"\n'


if __name__ == "__main__":
    status, printed = answer(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
    sys.stdout.write(printed)
    sys.exit(status)
