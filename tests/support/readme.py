"""README.rst's examples, as tests/test_readme.py and tests/test_notebook.py read them.

An example is a literal block (``::`` or ``.. code-block::``); the RST comment just
before it (``.. readme-test: KIND [note]``) says how it is checked. For the kinds that
run, the note may say what the example must print: ``prints "text" "more text"``.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs

__all__ = ["ALL", "EVAL_SCRIPT", "MAKEFILE", "README", "ROOT", "Example", "examples"]

ROOT = Path(__file__).parents[2]
README = ROOT / "README.rst"
MARK = re.compile(r"^\.\. readme-test: (\S+)(.*)$")
PRINTS = re.compile(r'^prints((?: "[^"]*")+)$')

MAKEFILE = "test:\n\t@echo tests pass > result.txt\n\t@cat result.txt\n"
"""The newcomer's project's Makefile: its test target writes a result file."""
EVAL_SCRIPT = 'import sys\n\nprint("case", sys.argv[-1], "passed")\n'
"""The notebook's evaluation script, ``python3 eval.py --case N``."""


@attrs.frozen
class Example:
    line: int
    kind: str
    note: str
    code: str

    def __str__(self) -> str:
        return f"README.rst:{self.line} ({self.kind})"

    @property
    def prints(self) -> list[str]:
        """What the note says the example prints (``prints "a" "b"``), else nothing."""
        found = PRINTS.match(self.note)
        return re.findall(r'"([^"]*)"', found.group(1)) if found else []


def examples(text: str) -> Iterator[Example]:
    lines = text.splitlines()
    mark: tuple[str, str] | None = None
    for number, line in enumerate(lines):
        found = MARK.match(line)
        if found:
            mark = (found.group(1), found.group(2).strip())
            continue
        if not _opens_block(line):
            continue
        block = _block(lines, number + 1)
        kind, note = mark if mark is not None else ("", "")
        yield Example(number + 1, kind, note, block)
        mark = None


def _opens_block(line: str) -> bool:
    stripped = line.rstrip()
    if stripped.startswith(".. code-block::"):
        return True
    return stripped.endswith("::") and not stripped.lstrip().startswith("..")


def _block(lines: list[str], start: int) -> str:
    body: list[str] = []
    for line in lines[start:]:
        if line.strip() and not line.startswith((" ", "\t")):
            break
        body.append(line)
    return textwrap.dedent("\n".join(body)).strip("\n")


ALL = list(examples(README.read_text(encoding="utf-8")))
