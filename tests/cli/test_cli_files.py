"""The command line's files: run --keep, cp in and out of a kept sandbox, the short lease."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piship_remote import cli
from piship_remote.testing import E2bServer
from tests.support.cli import E2bFactory, use_e2b

API_KEY = "e2b_cli_files_key_0123456789"
pytestmark = pytest.mark.timeout(30)


def kept_sandbox(mock: E2bServer, workspace: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["run", "--keep", "--workspace", str(workspace), "--", "true"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("kept sandbox ")
    return line.split()[2]


def test_the_cli_creates_sandboxes_on_a_five_minute_lease(
    e2b_server: E2bFactory, workspace: Path, cli_environ: pytest.MonkeyPatch
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    assert cli.main(["run", "--workspace", str(workspace), "--", "true"]) == 0
    create = next(r for r in mock.requests if r.method == "POST" and r.path == "/sandboxes")
    assert json.loads(create.body)["timeout"] == 300


def test_run_keep_leaves_the_sandbox_alive_and_names_it(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = kept_sandbox(mock, workspace, capsys)
    assert mock.live_sandboxes == [sandbox_id]
    assert not any(r.method == "DELETE" for r in mock.requests)


def test_cp_copies_a_file_into_a_kept_sandbox_and_back(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = kept_sandbox(mock, workspace, capsys)
    (workspace / "data.csv").write_text("a,b\n")
    common = ["--attach", sandbox_id, "--workspace", str(workspace)]
    assert cli.main(["cp", *common, str(workspace / "data.csv"), ":in/data.csv"]) == 0
    assert mock.files(sandbox_id)["/home/user/in/data.csv"] == b"a,b\n"
    assert cli.main(["cp", *common, ":in/data.csv", str(workspace / "back.csv")]) == 0
    assert (workspace / "back.csv").read_text() == "a,b\n"
    assert "copied 1 file(s)" in capsys.readouterr().err
    assert mock.live_sandboxes == [sandbox_id]


def test_cp_needs_exactly_one_remote_side(
    e2b_server: E2bFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = e2b_server(api_key=API_KEY)
    use_e2b(cli_environ, mock, API_KEY)
    sandbox_id = kept_sandbox(mock, workspace, capsys)
    status = cli.main(["cp", "--attach", sandbox_id, "--workspace", str(workspace), "a", "b"])
    assert status == cli.EXIT_CONFIG
    assert "exactly one side is ':REMOTE'" in capsys.readouterr().err


def test_cp_without_a_kept_sandbox_says_how_to_keep_one(
    capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    assert cli.main(["cp", "--workspace", str(workspace), "a", ":b"]) == cli.EXIT_CONFIG
    assert "ID=$(piship-remote create)" in capsys.readouterr().err
