"""First contact with the command line: version, hints, validation, JSON on every exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piship_remote import __version__, cli
from tests.support.cli import E2bFactory, use_e2b

API_KEY = "e2b_cli_polish_key_0123456789"


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == cli.EXIT_CONFIG
    return capsys.readouterr().err


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"piship-remote {__version__}"


def test_a_misspelt_option_names_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["run", "--timout", "5", "--", "true"], capsys)
    assert "unrecognized arguments: --timout" in err
    assert "(did you mean --timeout?)" in err
    assert err.startswith("usage: piship-remote run")


def test_a_misspelt_command_names_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert "(did you mean doctor?)" in usage_error(["doctr"], capsys)


def test_an_abbreviated_option_is_not_guessed(capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean --timeout?" in usage_error(["run", "--time", "5", "--", "true"], capsys)


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_serve_refuses_a_port_out_of_range(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "argument --port" in usage_error(["serve", "--port", port], capsys)


def test_a_missing_workspace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    err = usage_error(["run", "--workspace", str(missing), "--", "true"], capsys)
    assert f"the workspace '{missing}' does not exist" in err


def test_a_file_as_workspace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    err = usage_error(["run", "--workspace", str(file), "--", "true"], capsys)
    assert "is not a directory" in err


@pytest.mark.timeout(30)
def test_doctor_json_prints_the_error_as_json_when_activation_fails(
    cli_environ: pytest.MonkeyPatch, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cli_environ.setenv("PISHIP_E2B_ENDPOINT", "http://127.0.0.1:1")
    cli_environ.setenv("E2B_API_KEY", API_KEY)
    status = cli.main(["doctor", "--json", "--workspace", str(workspace)])
    assert status == cli.EXIT_UNAVAILABLE
    error = json.loads(capsys.readouterr().out)["error"]
    assert set(error) >= {"code", "message", "retryable", "userAction"}
    assert "127.0.0.1:1" in error["message"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("remote", [256, 2**32])
def test_run_never_exits_0_for_an_exit_code_out_of_range(
    remote: int,
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"exit_code": remote})
    use_e2b(cli_environ, mock, API_KEY)
    assert cli.main(["run", "--workspace", str(workspace), "--", "true"]) == 1
    assert f"the remote exit code {remote} does not fit" in capsys.readouterr().err
