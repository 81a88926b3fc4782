"""Ctrl-C: a script blocked in ``exec`` gets SIGINT; the remote command is killed, the
sandbox disposed, and the script ends with ``KeyboardInterrupt``, on both backends.

The double runs in the test process; the script (a temporary file run with
``sys.executable``) connects to its URL, activates inside a ``with`` block, prints
``started`` and runs a command that hangs. Once the double has the command, the
test sends SIGINT. E2B kills by SendSignal; the Kubernetes runtime cannot kill a
command, so the backend retires the claim and deletes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reliability_support import API_KEY, BEARER, HOST_SECRETS

from piship_remote.testing import CLAIMS, Cluster, E2bServer, KubernetesServer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import sys
    from piship_remote.sandbox.activation import activate_sandbox
    from piship_remote.backends.e2b.backend import E2bCompatibleBackend
    from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend

    kind, url, workspace, credential = sys.argv[1:5]
    if kind == "e2b":
        backend = E2bCompatibleBackend(
            endpoint=url, envd_url=url, credential=lambda: credential)
        network = "deny"
    else:
        backend = KubernetesAgentSandboxBackend(
            endpoint=url, router=url, template="python-pool", namespace="agents",
            poll_interval=0.01, credential=lambda: credential)
        network = "allow"
    policy = {"required": True, "network": {"mode": network}}
    sandbox = activate_sandbox(policy, backend=backend, workspace=workspace, settle_timeout=2.0)
    with sandbox:
        print("started", flush=True)
        sandbox.exec("sleep 600")
    print("not reached", flush=True)
    """
)
INTERRUPTED = (1, -signal.SIGINT, 130)


def run_and_interrupt(
    tmp_path: Path, kind: str, url: str, workspace: Path, credential: str, arrived: threading.Event
) -> subprocess.CompletedProcess[str]:
    """Start the script, wait until the double holds its command, send SIGINT, collect it."""
    script = tmp_path / "blocked_in_exec.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]), **HOST_SECRETS}
    process = subprocess.Popen(
        [sys.executable, str(script), kind, url, str(workspace), credential],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline().strip() == "started"
        assert arrived.wait(10), "the command never reached the double"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def check_interrupted(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode in INTERRUPTED, (result.returncode, result.stderr[-2000:])
    if result.returncode == 1:
        assert "KeyboardInterrupt" in result.stderr, result.stderr[-2000:]
    assert "not reached" not in result.stdout
    for secret in (API_KEY, BEARER, *HOST_SECRETS.values()):
        assert secret not in result.stdout and secret not in result.stderr


def hanging(arrived: threading.Event) -> Callable[[Any], dict[str, Any]]:
    def answer(command: Any) -> dict[str, Any]:
        text = command["process"]["args"][2] if isinstance(command, dict) else command
        if "sleep 600" not in text:
            return {"stdout": "", "exit_code": 0}
        arrived.set()
        return {"hang": True}

    return answer


@pytest.mark.timeout(40)
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_kills_the_e2b_command_and_deletes_the_sandbox(
    tmp_path: Path, workspace: Path, e2b_server: Callable[..., E2bServer]
) -> None:
    arrived = threading.Event()
    mock = e2b_server(command=hanging(arrived), api_key=API_KEY)
    result = run_and_interrupt(tmp_path, "e2b", mock.url, workspace, API_KEY, arrived)
    check_interrupted(result)
    kill = mock.wait_for("POST", "/process.Process/SendSignal", timeout=5)
    assert kill.json()["signal"] == "SIGNAL_SIGKILL"
    # The kill is fire-and-forget, so it may land before or after the DELETE.
    assert mock.count("DELETE", "/sandboxes/sbx1") == 1
    assert mock.live_sandboxes == []


@pytest.mark.timeout(40)
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_retires_and_deletes_the_kubernetes_claim(
    tmp_path: Path, workspace: Path, kubernetes_server: Callable[..., KubernetesServer]
) -> None:
    arrived = threading.Event()
    mock = kubernetes_server(hanging(arrived), Cluster(token=BEARER))
    result = run_and_interrupt(tmp_path, "k8s", mock.url, workspace, BEARER, arrived)
    check_interrupted(result)
    (claim,) = [r.json()["metadata"]["name"] for r in mock.find("POST", CLAIMS)]
    assert mock.find("DELETE", f"{CLAIMS}/{claim}"), "the claim was not deleted"
    assert mock.count("POST", "/execute") == 2  # the activation check and the command, once
    assert mock.live_claims == []
