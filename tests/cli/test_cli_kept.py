"""Kept sandboxes on the command line: create, kill, --lease, and --attach never deleted."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from piship_remote import cli
from piship_remote.testing import E2bServer
from tests.support.cli import E2bFactory, cli_process, e2b_environ, use_e2b

API_KEY = "e2b_cli_kept_key_0123456789"
pytestmark = pytest.mark.timeout(60)


def created(mock: E2bServer, workspace: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``piship-remote create``: the id it printed (the whole of stdout)."""
    assert cli.main(["create", "--workspace", str(workspace)]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1
    return out.strip()


def create_body(mock: E2bServer) -> dict[str, object]:
    create = next(r for r in mock.requests if r.method == "POST" and r.path == "/sandboxes")
    body: dict[str, object] = json.loads(create.body)
    return body


def deletes(mock: E2bServer) -> int:
    return sum(1 for r in mock.requests if r.method == "DELETE")


def test_create_prints_only_the_id_and_keeps_the_sandbox_for_an_hour(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = created(mock, workspace, capsys)
    assert sandbox_id == "sbx1"
    assert mock.live_sandboxes == [sandbox_id]
    assert create_body(mock)["timeout"] == 3600


def test_create_lease_sets_the_lifetime_and_says_it(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    assert cli.main(["create", "--lease", "2h", "--workspace", str(workspace)]) == 0
    output = capsys.readouterr()
    assert output.out == "sbx1\n"
    assert create_body(mock)["timeout"] == 7200
    assert "kept sandbox sbx1 for 2h" in output.err


def test_run_keep_says_on_stderr_how_long_it_lives_and_how_to_end_it(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "out\n"})
    use_e2b(cli_environ, mock, API_KEY)
    assert cli.main(["run", "--keep", "--workspace", str(workspace), "--", "echo out"]) == 0
    output = capsys.readouterr()
    assert output.out == "out\n"
    (line,) = [line for line in output.err.splitlines() if line.startswith("kept sandbox")]
    assert line.startswith("kept sandbox sbx1 for 1h (until ")
    assert "piship-remote kill sbx1" in line
    assert "--attach sbx1 --lease DURATION" in line
    assert mock.live_sandboxes == ["sbx1"]


def test_kill_deletes_a_kept_sandbox(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = created(mock, workspace, capsys)
    assert cli.main(["kill", sandbox_id]) == 0
    assert mock.live_sandboxes == []
    assert f"deleted sandbox {sandbox_id}" in capsys.readouterr().err


def test_kill_of_an_unknown_id_fails_and_says_so(
    e2b_server: E2bFactory, cli_environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    assert cli.main(["kill", "sbx404"]) == cli.EXIT_UNAVAILABLE
    assert "sbx404" in capsys.readouterr().err


def test_keeping_a_sandbox_of_the_embedded_local_service_is_refused(
    workspace: Path, cli_environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["create", "--backend", "local"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("CONFIG_INVALID: the local backend's sandboxes end with this command")
    assert "piship-remote serve" in err


# -- --attach: never deleted -------------------------------------------------------------


def test_run_attach_leaves_the_sandbox_alive_after_the_command(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"exit_code": 5})
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = created(mock, workspace, capsys)
    status = cli.main(["run", "--attach", sandbox_id, "--workspace", str(workspace), "--", "x"])
    assert status == 5
    assert mock.live_sandboxes == [sandbox_id]
    assert deletes(mock) == 0


def test_run_attach_without_lease_keeps_the_lease_the_sandbox_had(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "ok\n"})
    use_e2b(cli_environ, mock, API_KEY)
    assert cli.main(["create", "--lease", "10m", "--workspace", str(workspace)]) == 0
    sandbox_id = capsys.readouterr().out.strip()
    status = cli.main(["run", "--attach", sandbox_id, "--workspace", str(workspace), "--", "x"])
    assert status == 0
    asked = [
        r.json()["timeout"]
        for r in mock.requests
        if r.method == "POST" and r.path.startswith(f"/sandboxes/{sandbox_id}/")
    ]
    assert asked, "the attach sent no lifetime"
    assert all(590 <= seconds <= 600 for seconds in asked), asked
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "kept sandbox" in line]
    assert "for 1h" not in line
    assert mock.live_sandboxes == [sandbox_id]


def test_a_failed_cp_leaves_the_attached_sandbox_alive(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = created(mock, workspace, capsys)
    back = str(workspace / "back.txt")
    status = cli.main(["cp", "--attach", sandbox_id, "--workspace", str(workspace), ":typo", back])
    assert status == cli.EXIT_CONFIG
    assert "FILE_NOT_FOUND" in capsys.readouterr().err
    assert mock.live_sandboxes == [sandbox_id]
    assert deletes(mock) == 0


def test_a_timeout_leaves_the_attached_sandbox_alive(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"hang": True})
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = created(mock, workspace, capsys)
    argv = ["run", "--attach", sandbox_id, "--timeout", "0.3", "--workspace", str(workspace)]
    assert cli.main([*argv, "--", "sleep 60"]) == cli.EXIT_TIMEOUT
    assert mock.live_sandboxes == [sandbox_id]
    assert deletes(mock) == 0


def _interrupted_run(
    mock: E2bServer, workspace: Path, *options: str, by: int = signal.SIGINT
) -> int:
    """``run OPTIONS -- sleep 600`` in a child process, signalled ``by`` once its output began."""
    argv = ["run", *options, "--workspace", str(workspace), "--", "sleep 600"]
    process = cli_process(*argv, env=e2b_environ(mock, API_KEY))
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"started\n"
        process.send_signal(by)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert b"Traceback" not in stderr, stderr
    return process.returncode


@pytest.mark.usefixtures("ctrl_c")  # the child must not inherit SIGINT ignored
def test_ctrl_c_leaves_the_attached_sandbox_alive(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "started\n", "hang": True})
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = created(mock, workspace, capsys)
    assert _interrupted_run(mock, workspace, "--attach", sandbox_id) == cli.EXIT_INTERRUPTED
    assert mock.count("POST", "/process.Process/SendSignal") >= 1
    assert mock.live_sandboxes == [sandbox_id]
    assert deletes(mock) == 0


@pytest.mark.usefixtures("ctrl_c")  # the child must not inherit SIGINT ignored
def test_ctrl_c_with_keep_keeps_the_sandbox(e2b_server: E2bFactory, workspace: Path) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "started\n", "hang": True})
    assert _interrupted_run(mock, workspace, "--keep") == cli.EXIT_INTERRUPTED
    assert mock.live_sandboxes == ["sbx1"]
    assert deletes(mock) == 0


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.usefixtures("ctrl_c")  # the child must not inherit SIGINT ignored
def test_sigterm_and_sighup_leave_the_attached_sandbox_alive(
    ending: int,
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "started\n", "hang": True})
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = created(mock, workspace, capsys)
    assert _interrupted_run(mock, workspace, "--attach", sandbox_id, by=ending) == 128 + ending
    assert mock.count("POST", "/process.Process/SendSignal") >= 1
    assert mock.live_sandboxes == [sandbox_id]
    assert deletes(mock) == 0


@pytest.mark.usefixtures("ctrl_c")  # the child must not inherit SIGINT ignored
def test_sigterm_still_deletes_a_sandbox_that_was_not_kept(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    mock = e2b_server(api_key=API_KEY, command=lambda start: {"stdout": "started\n", "hang": True})
    assert _interrupted_run(mock, workspace, by=signal.SIGTERM) == -signal.SIGTERM
    assert mock.live_sandboxes == []
