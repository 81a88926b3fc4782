"""The command line against the mock services: exit statuses, Kubernetes, YAML policies, serve.

Everything but ``serve`` calls ``cli.main`` in this process (fast); every address is loopback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import requests

from piship_remote import cli
from piship_remote.testing import CLAIMS, KubernetesServer
from piship_remote.testing.kubernetes_server import Cluster
from tests.support.cli import NEEDS_BWRAP, E2bFactory, use_e2b
from tests.support.optional_peers import install_hint

API_KEY = "e2b_cli_backends_key_0123456789"
K8S_TOKEN = "k8s-cli-bearer-0123456789abcdef"
KubernetesFactory = Callable[..., KubernetesServer]
SERVE_READY_WITHIN = 20.0
SERVE_STOP_WITHIN = 15.0


def use_kubernetes(cli_environ: pytest.MonkeyPatch, mock: KubernetesServer) -> None:
    cli_environ.setenv("PISHIP_BACKEND", "kubernetes")
    cli_environ.setenv("PISHIP_K8S_API", mock.url)
    cli_environ.setenv("PISHIP_K8S_ROUTER", mock.url)
    cli_environ.setenv("PISHIP_K8S_TEMPLATE", "python-pool")
    cli_environ.setenv("PISHIP_K8S_NAMESPACE", "agents")
    cli_environ.setenv("PISHIP_K8S_TOKEN", K8S_TOKEN)


# -- exit statuses ----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_run_passes_the_commands_own_exit_code_through(
    e2b_server: E2bFactory, workspace: Path, cli_environ: pytest.MonkeyPatch
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"exit_code": 7})
    use_e2b(cli_environ, mock, API_KEY)
    assert cli.main(["run", "--workspace", str(workspace), "--", "exit 7"]) == 7
    assert mock.live_sandboxes == []


@pytest.mark.timeout(30)
def test_run_exits_124_when_the_timeout_expires(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"hang": True})
    use_e2b(cli_environ, mock, API_KEY)
    status = cli.main(["run", "--timeout", "0.3", "--workspace", str(workspace), "--", "sleep 60"])
    assert status == 124
    assert capsys.readouterr().err.startswith("TIMEOUT: the command ran longer than 0.3 s")


# -- Kubernetes, configured through the environment ------------------------------------


@pytest.mark.timeout(30)
def test_run_on_kubernetes_uses_one_claim_and_deletes_it(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(
        lambda command: {"stdout": "from-the-pod\n", "exit_code": 4}, Cluster(token=K8S_TOKEN)
    )
    use_kubernetes(cli_environ, mock)
    status = cli.main(["run", "--network", "allow", "--workspace", str(workspace), "--", "true"])
    assert status == 4, capsys.readouterr().err
    assert capsys.readouterr().out == "from-the-pod\n"
    assert mock.count("POST", CLAIMS) == 1
    assert mock.live_claims == []


@pytest.mark.timeout(30)
def test_doctor_on_kubernetes_reports_and_deletes_its_one_claim(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN))
    use_kubernetes(cli_environ, mock)
    status = cli.main(["doctor", "--network", "allow", "--workspace", str(workspace)])
    output = capsys.readouterr()
    assert status == 0, output.err
    assert output.out.startswith("enforced by kubernetes-agent-sandbox (required")
    assert mock.count("POST", CLAIMS) == 1
    assert mock.live_claims == []


@pytest.mark.timeout(30)
def test_kubernetes_refuses_a_deny_policy_before_any_claim(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN))
    use_kubernetes(cli_environ, mock)
    status = cli.main(["run", "--workspace", str(workspace), "--", "true"])
    assert status == cli.EXIT_UNAVAILABLE
    assert "does not provide network-deny" in capsys.readouterr().err
    assert mock.count("POST", CLAIMS) == 0


# -- YAML policies -------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_run_reads_a_yaml_policy_file(
    e2b_server: E2bFactory, workspace: Path, tmp_path: Path, cli_environ: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("yaml", reason=install_hint("yaml"))
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    policy = tmp_path / "policy.yaml"
    policy.write_text("sandbox:\n  required: true\n  network:\n    mode: allow\n")
    status = cli.main(["run", "--policy", str(policy), "--workspace", str(workspace), "--", "true"])
    assert status == 0
    created = next(r for r in mock.requests if r.method == "POST" and r.path == "/sandboxes")
    assert json.loads(created.body)["allow_internet_access"] is True


def test_a_yaml_policy_without_pyyaml_is_a_configuration_error_naming_the_fix(
    tmp_path: Path, cli_environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_environ.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    policy = tmp_path / "policy.yml"
    policy.write_text("required: true\n")
    assert cli.main(["run", "--policy", str(policy), "--", "true"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("CONFIG_INVALID: reading a YAML policy needs PyYAML")
    assert "\nAction: pip install 'piship-remote[yaml]'" in err


def test_a_malformed_yaml_policy_is_a_configuration_error(
    tmp_path: Path, cli_environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("yaml", reason=install_hint("yaml"))
    policy = tmp_path / "policy.yaml"
    policy.write_text("required: [true\n")
    assert cli.main(["run", "--policy", str(policy), "--", "true"]) == cli.EXIT_CONFIG
    assert capsys.readouterr().err.startswith(
        f"CONFIG_INVALID: the policy file {policy} is not valid YAML"
    )


# -- serve ------------------------------------------------------------------------------


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_healthy(url: str, process: subprocess.Popen[str], within: float) -> bool:
    """Poll ``/health`` until it answers 204, the process exits, or ``within`` seconds pass."""
    deadline = time.monotonic() + within
    with requests.Session() as session:
        session.trust_env = False  # loopback only, never through a proxy
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if session.get(f"{url}/health", timeout=1).status_code == 204:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.1)  # not listening yet; nothing to wait on but the port
    return False


@attrs.frozen
class Served:
    """How a ``serve`` child process went: healthy at all, its status and its output."""

    url: str
    healthy: bool
    status: int
    stdout: str
    stderr: str


def serve_until_healthy(*options: str, env: dict[str, str] | None = None) -> Served:
    """``serve --port P OPTIONS`` in a child process until ``/health`` answers, then SIGTERM."""
    port = _free_loopback_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "piship_remote", "serve", "--port", str(port), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), **(env or {})},
    )
    try:
        healthy = _wait_healthy(url, process, SERVE_READY_WITHIN)
        process.terminate()
        stdout, stderr = process.communicate(timeout=SERVE_STOP_WITHIN)
    finally:
        process.kill()
        process.wait()
    return Served(url, healthy, process.returncode, stdout, stderr)


@NEEDS_BWRAP
@pytest.mark.timeout(60)
def test_serve_answers_health_and_stops_cleanly_on_sigterm() -> None:
    served = serve_until_healthy()
    assert served.healthy, served.stderr
    assert served.status == 0, served.stderr
    assert f"endpoint: {served.url}" in served.stdout
    assert served.stdout.rstrip().endswith("stopped; every sandbox was deleted")


@NEEDS_BWRAP
@pytest.mark.timeout(60)
def test_serve_prints_the_export_lines_for_a_given_api_key() -> None:
    key = "e2b_fixed_key_for_serve_0123456789"
    served = serve_until_healthy("--api-key", key, "--max-processes", "64")
    assert served.healthy, served.stderr
    assert f"export PISHIP_E2B_ENDPOINT={served.url}" in served.stdout
    assert f"export E2B_API_KEY={key}" in served.stdout
    assert "processes: 64" in served.stdout


@NEEDS_BWRAP
@pytest.mark.timeout(60)
def test_serve_takes_a_cpu_limit_per_sandbox() -> None:
    served = serve_until_healthy("--max-cpus", "0.5")
    assert served.healthy, served.stderr
    assert "cpu per sandbox: at most 0.5 CPUs of this host" in served.stdout


@NEEDS_BWRAP
@pytest.mark.timeout(60)
def test_serve_takes_its_api_key_from_e2b_api_key() -> None:
    key = "e2b_key_from_the_environment_0123456789"
    served = serve_until_healthy(env={"E2B_API_KEY": key})
    assert served.healthy, served.stderr
    assert f"export E2B_API_KEY={key}" in served.stdout


@NEEDS_BWRAP
@pytest.mark.timeout(60)
def test_serve_reads_its_api_key_from_a_file(tmp_path: Path) -> None:
    key = "e2b_key_from_a_file_0123456789"
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    served = serve_until_healthy(
        "--api-key-file", str(key_file), env={"E2B_API_KEY": "not-this-one-0123456789"}
    )
    assert served.healthy, served.stderr
    assert f"export E2B_API_KEY={key}" in served.stdout


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_an_unreadable_or_empty_api_key_file_is_a_configuration_error(
    content: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    assert cli.main(["serve", "--api-key-file", str(key_file)]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("CONFIG_INVALID: ")
    assert str(key_file) in err
