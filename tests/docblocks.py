"""The Python code blocks of README.md and docs/*.md, with the marker that says how each is tested.

Every fenced ```python block is run by tests/test_doc_examples.py unless an HTML comment on the
line right before its fence says otherwise:

    <!-- example: server -->                  run with a real `hwpool serve` (HWPOOL_SOCKET set)
    <!-- example: tested-by tests/X.py -->    run by that test, which asks for it with
                                              ``docblocks.blocks_tested_by(__file__)`` (it needs
                                              a context of its own, or checks what it prints)
    <!-- example: copy-of README.md -->       the same text as a block of that page, which is
                                              itself run or tested
    <!-- example: fragment: REASON -->        not a program (signatures, a part of a larger one);
                                              the reason is required

A block with no marker that does not run fails the test, so every example is either run or
marked with the test that covers it.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)[ \t]*$")
MARKER = re.compile(r"^<!-- example: ([a-z-]+)(?::? (.+?))? -->$")
KINDS = {"run", "server", "tested-by", "copy-of", "fragment"}
PYTHON_TAGS = {"py", "python3", "pycon", "ipython", "Python"}
"""Tags that mean Python but would escape the check: such a block must be tagged ``python``."""


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language tag, its marker and its code."""

    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    kind: str  # "run" when no marker
    argument: str  # the test file, the page copied, the fragment's reason; "" otherwise
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    page = str(path.relative_to(ROOT))
    found = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        marker = MARKER.match(lines[index - 1]) if index > 0 else None
        kind, argument = ("run", "") if marker is None else (marker[1], marker[2] or "")
        code = "\n".join(lines[index + 1 : end]) + "\n"
        found.append(Block(page, index + 1, fence[1], kind, argument, code))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    """Every fenced block of every page, in page order."""
    return [block for path in PAGES for block in _blocks_of(path)]


def python_blocks() -> list[Block]:
    """Every ```python block of every page."""
    return [block for block in all_blocks() if block.language == "python"]


def stray_markers() -> list[str]:
    """Markers that are not right before a ```python fence (stale, or on another block)."""
    stray = []
    for path in PAGES:
        lines = path.read_text().splitlines()
        for index, line in enumerate(lines):
            if line.startswith("<!-- example:") and (
                index + 1 >= len(lines) or lines[index + 1] != "```python"
            ):
                stray.append(f"{path.relative_to(ROOT)}:{index + 1}: {line}")
    return stray


def blocks_tested_by(test_file: str) -> list[Block]:
    """The blocks marked ``tested-by`` the test module ``test_file`` (its ``__file__``)."""
    name = str(Path(test_file).resolve().relative_to(ROOT))
    blocks = [b for b in python_blocks() if b.kind == "tested-by" and b.argument == name]
    assert blocks, f"no block of README.md or docs/ is marked <!-- example: tested-by {name} -->"
    return blocks
