"""Without the ``otel`` extra nothing is imported and nothing is recorded: a child process
whose imports of ``opentelemetry`` are refused runs an activation, commands, a push and
pull, file transfers, a started command and a pool map."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import importlib.abc, json, logging, sys, tempfile

    if "--configure-logging" in sys.argv:
        logging.basicConfig(level=logging.INFO)

    class Refuse(importlib.abc.MetaPathFinder):
        asked = []

        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                Refuse.asked.append(name)
                raise ImportError(f"refused: {name}")
            return None

    sys.meta_path.insert(0, Refuse())

    from piship_remote import E2bCompatibleBackend, SandboxPool, activate_sandbox
    from piship_remote.telemetry import Telemetry
    from piship_remote.testing import E2bServer

    policy = {"required": True, "network": {"mode": "deny"}}
    workspace = tempfile.mkdtemp()
    with open(workspace + "/a.txt", "w") as f:
        f.write("hello")
    with E2bServer() as server, E2bCompatibleBackend(
        endpoint=server.url, envd_url=server.url
    ) as backend:
        with activate_sandbox(
            policy, backend=backend, workspace=workspace, env={"GITHUB_TOKEN": "x"}, sync="push"
        ) as sandbox:
            sandbox.run("echo hi")
            sandbox.push()
            sandbox.pull()
            sandbox.files.write("/tmp/x", b"abc")
            sandbox.files.read("/tmp/x")
            sandbox.start("echo started").wait()
        with SandboxPool(policy, backend=backend, workspace=workspace, env={}, size=2) as pool:
            pool.map("echo {item}", [1, 2])
    print(json.dumps({
        "asked": sorted(set(Refuse.asked)),
        "loaded": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
        "enabled": Telemetry.load("e2b-compatible").enabled,
    }))
    """
)


def _run_child(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
    )


def test_without_the_extra_nothing_is_imported_and_nothing_recorded() -> None:
    done = _run_child()
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["asked"] == ["opentelemetry"]  # the library looked for it, and went on
    assert found["loaded"] == []
    assert found["enabled"] is False


def test_no_log_line_reaches_stderr_unless_the_application_configures_logging() -> None:
    assert _run_child().stderr == ""


def test_a_configured_log_says_what_happened_at_info() -> None:
    lines = _run_child("--configure-logging").stderr.splitlines()
    assert "INFO:piship_remote:e2b-compatible sandbox sbx1 created" in lines
    assert "INFO:piship_remote:e2b-compatible sandbox sbx1 deleted" in lines
    assert any("GITHUB_TOKEN" in line and line.startswith("WARNING") for line in lines)
