"""The ``piship-remote`` command line, run as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from piship_remote import cli as cli_module
from piship_remote.testing import E2bServer
from tests.support.cli import NEEDS_BWRAP, E2bFactory, e2b_environ

API_KEY = "e2b_cli_test_key_0123456789"


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "piship_remote", *args],
        capture_output=True,
        text=True,
        env={**_clean_environ(), **(env or {})},
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def _clean_environ() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "PYTHONPATH", "SYSTEMROOT")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    return env


def run_in_process(
    monkeypatch: pytest.MonkeyPatch, mock: E2bServer, workspace: Path, *command: str
) -> tuple[int, list[str]]:
    """``cli.main(["run", ..., "--", *command])`` against ``mock``: status and the scripts run."""
    for name, value in mock_env(mock).items():
        monkeypatch.setenv(name, value)
    status = cli_module.main(["run", "--workspace", str(workspace), "--", *command])
    return status, [_script(start) for start in _starts(mock)]


def _starts(mock: E2bServer) -> list[dict[str, Any]]:
    starts = [r for r in mock.requests if r.path == "/process.Process/Start"][1:]  # 0: probe
    return [json.loads(r.body[5:]) for r in starts]


def _script(start: dict[str, Any]) -> str:
    args: list[str] = start["process"]["args"]
    assert args[:2] == ["-l", "-c"]
    return args[2]


def mock_env(mock: E2bServer) -> dict[str, str]:
    return e2b_environ(mock, API_KEY)


@pytest.mark.parametrize(
    "command", [[], ["demo"], ["run"], ["map"], ["create"], ["kill"], ["doctor"], ["serve"]]
)
def test_every_subcommand_has_help(command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.returncode == 0
    assert "usage: piship-remote" in result.stdout


@pytest.mark.timeout(60)
def test_run_streams_output_and_exits_with_the_commands_code(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "hello\n", "exit_code": 3})
    result = cli("run", "--workspace", str(workspace), "--", "echo", "hello", env=mock_env(mock))
    assert result.returncode == 3, result.stderr
    assert result.stdout == "hello\n"
    (start,) = [r for r in mock.requests if r.path == "/process.Process/Start"][1:]
    assert b"echo hello" in start.body
    assert mock.live_sandboxes == []


@pytest.mark.timeout(30)
def test_run_quotes_each_argument_when_given_several(
    e2b_server: E2bFactory, workspace: Path, cli_environ: pytest.MonkeyPatch
) -> None:
    mock = e2b_server(api_key=API_KEY)
    status, scripts = run_in_process(cli_environ, mock, workspace, "printf", "%s\\n", "a b")
    assert status == 0
    assert scripts == ["printf '%s\\n' 'a b'"]


@pytest.mark.timeout(30)
def test_run_takes_a_single_argument_as_a_shell_line(
    e2b_server: E2bFactory, workspace: Path, cli_environ: pytest.MonkeyPatch
) -> None:
    mock = e2b_server(api_key=API_KEY)
    status, scripts = run_in_process(cli_environ, mock, workspace, "echo $HOME | wc -c")
    assert status == 0
    assert scripts == ["echo $HOME | wc -c"]


@pytest.mark.timeout(60)
def test_run_reads_the_policy_file(e2b_server: E2bFactory, workspace: Path, tmp_path: Path) -> None:
    mock = e2b_server(api_key=API_KEY)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"required": True, "network": {"mode": "allow"}}))
    result = cli(
        "run",
        "--policy",
        str(policy),
        "--workspace",
        str(workspace),
        "--",
        "true",
        env=mock_env(mock),
    )
    assert result.returncode == 0, result.stderr
    created = next(r for r in mock.requests if r.method == "POST" and r.path == "/sandboxes")
    assert json.loads(created.body)["allow_internet_access"] is True


def test_a_malformed_policy_file_is_a_configuration_error(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"required": True, "network": {"mode": "open"}}))
    result = cli("run", "--policy", str(policy), "--", "true")
    assert result.returncode == 2
    assert result.stderr.startswith("CONFIG_INVALID: ")


def test_a_plain_http_endpoint_off_loopback_is_a_configuration_error() -> None:
    result = cli("run", "--endpoint", "http://sandbox.example", "--", "true")
    assert result.returncode == 2
    assert result.stderr.startswith("NETWORK_DENIED: Refusing non-HTTPS endpoint")


def test_an_unreachable_service_exits_3_with_the_code_and_action() -> None:
    result = cli(
        "run", "--endpoint", "http://127.0.0.1:1", "--", "true", env={"E2B_API_KEY": API_KEY}
    )
    assert result.returncode == 3
    assert result.stderr.startswith("GATEWAY_UNREACHABLE: The distribution requires a sandbox")
    assert "127.0.0.1:1 failed: ECONNREFUSED" in result.stderr
    assert "\nAction: Check that the sandbox service is running" in result.stderr


def test_a_rejected_key_never_reaches_the_output(e2b_server: E2bFactory) -> None:
    mock = e2b_server(api_key="the-right-key-000000")
    result = cli("run", "--", "true", env=mock_env(mock))
    assert result.returncode == 2  # issue 44: a refused key is the user's to fix (was 3)
    assert "HTTP 401" in result.stderr
    assert API_KEY not in result.stderr + result.stdout


def test_kubernetes_needs_its_endpoints() -> None:
    result = cli("run", "--backend", "kubernetes", "--", "true")
    assert result.returncode == 2
    assert "--api, --router, --pool" in result.stderr


def test_run_needs_a_command() -> None:
    result = cli("run")
    assert result.returncode == 2
    assert "run needs a command after --" in result.stderr


@pytest.mark.timeout(60)
def test_doctor_prints_the_containment_line(e2b_server: E2bFactory, workspace: Path) -> None:
    mock = e2b_server(api_key=API_KEY)
    result = cli("doctor", "--workspace", str(workspace), env=mock_env(mock))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "enforced by e2b-compatible (required, attested by the backend): network-deny"
    )
    assert mock.live_sandboxes == []


@pytest.mark.timeout(60)
def test_doctor_json_is_the_report_dict(e2b_server: E2bFactory, workspace: Path) -> None:
    mock = e2b_server(api_key=API_KEY)
    result = cli("doctor", "--json", "--workspace", str(workspace), env=mock_env(mock))
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["level"] == "enforced"
    assert report["networkDenial"]["evidence"] == "attested"
    assert API_KEY not in result.stdout


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_kills_the_remote_command_and_exits_130(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "started\n", "hang": True})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "piship_remote",
            "run",
            "--workspace",
            str(workspace),
            "--",
            "sleep 600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_clean_environ(), **mock_env(mock)},
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "started\n"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert mock.count("POST", "/process.Process/SendSignal") >= 1
    assert mock.live_sandboxes == []


@NEEDS_BWRAP
@pytest.mark.timeout(120)
def test_demo_shows_containment_and_exits_0(tmp_path: Path) -> None:
    result = cli("demo", cwd=tmp_path, timeout=110)
    assert result.returncode == 0, result.stderr
    assert "Containment: enforced by e2b-compatible (required" in result.stdout
    assert "PISHIP_DEMO_API_TOKEN=<not set>" in result.stdout
    assert "blocked: no route out" in result.stdout
    assert "sk-demo-host-secret" not in result.stdout


@NEEDS_BWRAP
@pytest.mark.timeout(120)
def test_run_on_the_local_backend(tmp_path: Path) -> None:
    result = cli("run", "--backend", "local", "--", "echo from-the-sandbox; exit 5", cwd=tmp_path)
    assert result.returncode == 5, result.stderr
    assert result.stdout == "from-the-sandbox\n"


@NEEDS_BWRAP
@pytest.mark.timeout(120)
def test_run_on_the_local_backend_keeps_each_arguments_quoting(tmp_path: Path) -> None:
    result = cli(
        "run", "--backend", "local", "--", "printf", "[%s]\\n", "a b", "$HOME", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[a b]\n[$HOME]\n"
