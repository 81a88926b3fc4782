"""Print README.rst's set-up commands, one a line, for .ci/run to run verbatim.

A set-up command is the literal block after a ``.. readme-test: set-up`` comment.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.rst"
MARK = ".. readme-test: set-up"


def set_up_commands(text: str) -> list[str]:
    lines = text.splitlines()
    commands = []
    for number, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        opening = next(i for i in range(number + 1, len(lines)) if lines[i].rstrip().endswith("::"))
        body = []
        for inner in lines[opening + 1 :]:
            if inner.strip() and not inner.startswith((" ", "\t")):
                break
            body.append(inner)
        command = textwrap.dedent("\n".join(body)).strip()
        if "\n" in command:
            sys.exit(f"README.rst:{number + 1}: a set-up command must be one line")
        commands.append(command)
    return commands


if __name__ == "__main__":
    print("\n".join(set_up_commands(README.read_text(encoding="utf-8"))))
