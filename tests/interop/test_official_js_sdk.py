"""The official E2B JavaScript SDK (npm ``e2b`` 2.51.0, run by Node) against the local service.

``.ci/run`` installs the package into the repository's ``.interop-node/``
(gitignored); without Node or that install the test is skipped, saying which. The
script ``js/files.mjs`` gets the service's URL as both ``apiUrl`` and ``sandboxUrl``,
so every request stays on loopback, and prints which calls behaved; ``js/lifecycle.mjs``
does the same for pause, resume (by connect), metrics and watching.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_e2b import local_e2b_service

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".interop-node" / "node_modules"
SCRIPT = Path(__file__).with_name("js") / "files.mjs"
LIFECYCLE_SCRIPT = Path(__file__).with_name("js") / "lifecycle.mjs"
INSTALL = "npm install --prefix .interop-node e2b@2.51.0"
RUN_TIMEOUT = 60
CALLS = [
    "files.write",
    "files.read",
    "files.write several entries",
    "files.list",
    "files.exists",
    "files.getInfo",
    "files.makeDir",
    "files.rename",
    "files.remove",
    "files.read missing is FileNotFoundError",
    "uploadUrl",
    "downloadUrl",
    "Sandbox.list",
    "Sandbox.connect",
    "getHost",
    "commands.run",
]
LIFECYCLE_CALLS = [
    "files.watchDir",
    "getMetrics",
    "pause",
    "pause again is false",
    "isRunning while paused",
    "Sandbox.list paused",
    "getInfo paused",
    "Sandbox.connect resumes",
    "files kept",
    "background process survives",
    "lifecycle onTimeout pause",
    "timeout pauses",
    "Sandbox.connect resumes the auto-paused",
]


@pytest.fixture
def node() -> str:
    found = shutil.which("node")
    if found is None:
        pytest.skip("node is not installed, so the JavaScript SDK cannot be run")
    if not (NODE_MODULES / "e2b" / "package.json").is_file():
        pytest.skip(f"the npm package e2b is not installed; run: {INSTALL}")
    return found


@pytest.fixture
def service() -> Iterator[object]:
    with local_e2b_service() as running:
        yield running


def run_script(node: str, service: object, tmp_path: Path, source: Path) -> dict[str, bool]:
    """Run one SDK script against ``service``; the results it printed."""
    (tmp_path / "node_modules").symlink_to(NODE_MODULES, target_is_directory=True)
    script = tmp_path / source.name
    shutil.copyfile(source, script)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    environment["NO_PROXY"] = "127.0.0.1,localhost"
    completed = subprocess.run(
        [node, str(script), service.url, service.api_key],  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env=environment,
        cwd=tmp_path,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    results: dict[str, bool] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results


def test_the_javascript_sdk_file_and_sandbox_calls_work_on_the_local_service(
    node: str, service: object, tmp_path: Path
) -> None:
    assert run_script(node, service, tmp_path, SCRIPT) == dict.fromkeys(CALLS, True)


def test_the_javascript_sdk_pause_resume_metrics_and_watch_work_on_the_local_service(
    node: str, service: object, tmp_path: Path
) -> None:
    results = run_script(node, service, tmp_path, LIFECYCLE_SCRIPT)
    assert results == dict.fromkeys(LIFECYCLE_CALLS, True)


PROCESS_SCRIPT = Path(__file__).with_name("js") / "process.mjs"
PROCESS_CALLS = [
    "commands.sendStdin",
    "commands.closeStdin",
    "commands.connect",
    "commands.connect unknown pid is NotFoundError",
    "commands.list",
    "commands.kill",
    "commands.kill ends with CommandExitError",
    "commands.run cwd /tmp",
    "commands.run unknown user is AuthenticationError",
    "commands.run user root is uid 0",
    "commands.run user root starts in /root",
    "files.write user root",
    "files.read user root",
    "pty.create",
    "pty.sendInput",
    "pty.resize",
    "pty.connect",
    "pty.kill",
    "pty.kill ends the terminal",
]


def test_the_javascript_sdk_command_and_pty_calls_work_on_the_local_service(
    node: str, service: object, tmp_path: Path
) -> None:
    results = run_script(node, service, tmp_path, PROCESS_SCRIPT)
    assert results == dict.fromkeys(PROCESS_CALLS, True)


SANDBOX_SCRIPT = Path(__file__).with_name("js") / "sandbox.mjs"
SANDBOX_CALLS = [
    "commands.run envs",
    "commands.run stderr",
    "commands.run onStdout",
    "commands.run non-zero is CommandExitError",
    "commands.run background + wait",
    "commands.run timeoutMs ends the command",
    "setTimeout",
    "getInfo",
    "kill",
    'kill under a running command is TimeoutError "sandbox was killed"',
    "create allowInternetAccess false is loopback only",
    "create allowInternetAccess true has an interface out",
]


def test_the_javascript_sdk_sandbox_and_command_basics_work_on_the_local_service(
    node: str, service: object, tmp_path: Path
) -> None:
    results = run_script(node, service, tmp_path, SANDBOX_SCRIPT)
    assert results == dict.fromkeys(SANDBOX_CALLS, True)
