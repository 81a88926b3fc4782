"""``piship-remote map`` tells what went wrong: a failed task's last lines, what each sandbox
was sent, and a refused key or template as one error (exit 2) before any task runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from piship_remote.cli import main
from tests.support.cli import NEEDS_BWRAP, E2bFactory, use_e2b
from tests.support.pool import script

pytestmark = pytest.mark.timeout(60)
API_KEY = "e2b_map_output_key"


def noisy(start: dict[str, Any]) -> dict[str, Any]:
    """``fail`` in the script: 30 lines on each stream, then exit 1; ``slow``: no end;
    else one line."""
    if "slow" in script(start):
        return {"stdout": "collected 3 items\n", "stderr": "still going\n", "hang": True}
    if "fail" not in script(start):
        return {"stdout": "fine\n"}
    return {
        "stdout": "".join(f"out {n}\n" for n in range(30)),
        "stderr": "".join(f"err {n}\n" for n in range(30)),
        "exit_code": 1,
    }


@pytest.fixture
def mapped(e2b_server: E2bFactory, cli_environ: pytest.MonkeyPatch, workspace: Path):
    def run(*args: str, server_key: str = API_KEY, **server: Any) -> tuple[int, Any]:
        mock = e2b_server(api_key=server_key, command=noisy, distinct_ids=True, **server)
        use_e2b(cli_environ, mock, API_KEY)
        return main(["map", "--workspace", str(workspace), *args]), mock

    return run


def creates(mock: Any) -> int:
    return sum(1 for r in mock.requests if r.method == "POST" and r.path == "/sandboxes")


def test_a_failed_task_shows_the_last_lines_of_stderr_and_stdout(mapped, capsys) -> None:
    status, _ = mapped("--size", "2", "--", "run {item}", "ok-one", "fail-two")
    out = capsys.readouterr().out
    assert status == 1
    failed = out[out.index("failed    fail-two") :].splitlines()
    assert failed[1:11] == [f"  stderr | err {n}" for n in range(20, 30)]
    assert failed[11:21] == [f"  stdout | out {n}" for n in range(20, 30)]


def test_an_ok_task_shows_one_line_only(mapped, capsys) -> None:
    mapped("--", "run {item}", "ok-one")
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("ok        ok-one ")


def test_a_timed_out_task_prints_the_timeout_it_was_given(mapped, capsys) -> None:
    status, _ = mapped("--timeout", "0.7", "--", "run {item}", "slow")
    out = capsys.readouterr().out
    assert status == 1
    assert "timeout   slow" in out and "timeout:0.7" in out


def test_a_timed_out_task_shows_what_it_wrote_before_it_was_killed(mapped, capsys) -> None:
    mapped("--timeout", "0.7", "--", "run {item}", "slow")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == ["  stderr | still going", "  stdout | collected 3 items"]


def test_a_command_without_item_warns_once_in_plain_words(mapped, capsys) -> None:
    status, _ = mapped("--", "make test", "a", "b")
    err = capsys.readouterr().err
    assert status == 0
    assert err.count("warning: the task command has no {item}") == 1


def test_a_command_with_an_open_quote_is_refused_before_any_sandbox(mapped, capsys) -> None:
    status, mock = mapped("--", "echo 'open {item}", "a")
    assert status == 2
    assert "CONFIG_INVALID: the task command leaves a quotation mark open" in (
        capsys.readouterr().err
    )
    assert creates(mock) == 0


def test_awk_braces_and_the_item_both_work(mapped, capsys) -> None:
    status, _ = mapped("--", "awk '{print}' f && echo {item}", "x y")
    assert status == 0
    assert "ok        x y" in capsys.readouterr().out


def test_a_refused_key_is_a_credential_error_that_stops_the_creates(mapped, capsys) -> None:
    status, mock = mapped("--size", "2", "--", "echo {item}", *"abcdef", server_key="other")
    out, err = capsys.readouterr()
    assert status == 2
    assert err.startswith("CREDENTIAL_DENIED: ") and "refused the API key" in err
    assert "Action: Set E2B_API_KEY" in err
    assert out == ""  # no task line: none ran
    assert creates(mock) <= 2  # at most one create per pool slot, never one per item


def test_the_unenforceable_wording_gets_a_plain_meaning_line(mapped, capsys) -> None:
    mapped("--", "echo {item}", "a", server_key="other")
    assert "\nMeaning: the policy requires a sandbox and none could be had" in (
        capsys.readouterr().err
    )


@NEEDS_BWRAP
def test_an_unknown_template_is_a_configuration_error_listing_the_offered_ones(
    cli_environ: pytest.MonkeyPatch, workspace: Path, capsys
) -> None:
    status = main(
        ["map", "--backend", "local", "--template", "nosuch", "--workspace", str(workspace),
         "--", "echo {item}", "a", "b"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 2
    assert err.startswith("CONFIG_INVALID: ")
    assert "no template 'nosuch'; it offers: base" in err
    assert out == ""


@NEEDS_BWRAP
def test_sync_prints_one_push_summary_by_reason_before_the_tasks(
    cli_environ: pytest.MonkeyPatch, workspace: Path, capsys
) -> None:
    (workspace / ".gitignore").write_text("*.log\n")
    (workspace / "a.txt").write_text("a\n")
    (workspace / "one.log").write_text("1\n")
    (workspace / "two.log").write_text("2\n")
    status = main(
        ["map", "--backend", "local", "--sync", "--size", "2", "--workspace", str(workspace),
         "--", "cat {item}", "a.txt", "a.txt", "a.txt"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 0
    [summary] = [line for line in err.splitlines() if line.startswith("each sandbox gets")]
    assert summary == ("each sandbox gets 2 file(s), 8 B; skipped 2: 2 ignored (-v lists them)")
    assert "skipped one.log" not in err


@NEEDS_BWRAP
def test_sync_with_v_lists_every_path_left_out(
    cli_environ: pytest.MonkeyPatch, workspace: Path, capsys
) -> None:
    (workspace / ".gitignore").write_text("*.log\n")
    (workspace / "one.log").write_text("1\n")
    status = main(
        ["map", "--backend", "local", "--sync", "-v", "--workspace", str(workspace),
         "--", "true {item}", "x"]
    )  # fmt: skip
    assert status == 0
    assert "  skipped one.log: ignored" in capsys.readouterr().err
