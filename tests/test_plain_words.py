"""Messages and hints speak of this library's own concepts, not of the product it was
ported from. Two texts are pinned and keep their words: the containment line of a
snapshot workspace (sync="none") and the prefix of a failed required activation."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import piship_remote
from piship_remote.model.report import (
    ContainmentReport,
    WorkspaceSyncReport,
    describe_containment,
    synced_workspace_report,
)

PACKAGE = Path(piship_remote.__file__).parent

FOREIGN = re.compile(
    r"MCP|coding[- ]agent|\bdistribution\b|agent process|in-process extension|agent edits"
    r"|\bPiShip\b(?!Error)|tool subprocess|local file tools|start a new session"
)
# The pinned texts, as the string literals that spell them.
PINNED = {
    (
        "report.py",
        '"Workspace: snapshot. Remote commands see a copy, not the files the agent edits;"',
    ),
    ("report.py", '" this is not a complete coding-agent workspace."'),
    ("report.py", '" path rules; they govern only the local file tools."'),
    (
        "report.py",
        '"Contains shell commands; MCP stdio servers cannot be contained by this backend"',
    ),
    ("report.py", '" and do not start, not the agent process or in-process extensions"'),
    (
        "_activation_steps.py",
        'f"The distribution requires a sandbox, but it cannot be enforced: {reason}"',
    ),
}


def foreign_literals() -> list[tuple[str, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING and FOREIGN.search(token.string):
                found.append((path.name, token.string))
    return found


def test_only_the_pinned_texts_use_the_other_products_words() -> None:
    assert set(foreign_literals()) == PINNED


def test_a_synced_containment_line_says_it_plainly() -> None:
    report = ContainmentReport(
        level="enforced",
        adapter="e2b-compatible",
        provider="e2b-compatible",
        required=True,
        planes=("network-deny", "environment-filter", "host-filesystem-isolation"),
        network="deny",
        isolation="remote",
        workspace=synced_workspace_report(
            WorkspaceSyncReport(pushed_files=2, pushed_bytes=10, results_return=False)
        ),
    )
    line = describe_containment(report)
    assert FOREIGN.search(line) is None, line
    assert "Contains the shell commands it runs, not this Python process." in line
    assert "Workspace: synced (pushed 2 files, 10 bytes)" in line
