"""``doctor --backend kubernetes``: the credentials' checks before any claim is created.

Each check is printed on stderr as it reads (``ok: …``, ``warn: …``, ``fail: … (fix:
…)``); a failed one ends ``doctor`` with :class:`ChecksFailed`, before activation.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from piship_remote.cli._setup import kubernetes_backend
from piship_remote.model.errors import SandboxUnavailable

__all__ = ["ChecksFailed", "kubernetes_checks"]


class ChecksFailed(SandboxUnavailable):
    """A check the Kubernetes backend needs failed; ``checks`` holds every finding."""

    def __init__(self, failed: list[Any], checks: list[dict[str, Any]]) -> None:
        super().__init__(
            "the Kubernetes checks failed: " + "; ".join(check.what for check in failed),
            user_action="; ".join(check.fix for check in failed if check.fix) or None,
            component="sandbox",
        )
        self.checks = checks


def kubernetes_checks(args: argparse.Namespace, *, quiet: bool = False) -> list[dict[str, Any]]:
    """Run the checks (printing each line unless ``quiet``); raises :class:`ChecksFailed`."""
    with kubernetes_backend(args) as backend:
        findings = backend.preflight()
    for check in findings:
        if not quiet:
            print(check.line, file=sys.stderr)
    checks = [check.to_dict() for check in findings]
    failed = [check for check in findings if check.status == "fail"]
    if failed:
        raise ChecksFailed(failed, checks)
    return checks
