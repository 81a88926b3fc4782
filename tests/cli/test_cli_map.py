"""``piship-remote map``: a command per item over a pool, its lines, table and status."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from piship_remote.cli import main
from tests.support.cli import E2bFactory, use_e2b
from tests.support.pool import exit_as_asked

pytestmark = pytest.mark.timeout(30)
API_KEY = "e2b_map_test_key"


@pytest.fixture
def mapped(e2b_server: E2bFactory, cli_environ: pytest.MonkeyPatch, workspace: Path):
    mock = e2b_server(api_key=API_KEY, command=exit_as_asked, distinct_ids=True)
    use_e2b(cli_environ, mock, API_KEY)

    def run(*args: str) -> int:
        return main(["map", "--workspace", str(workspace), "--size", "2", *args])

    run.mock = mock  # type: ignore[attr-defined]
    return run


def test_every_task_ok_exits_0_with_a_line_each_and_a_table(mapped, capsys) -> None:
    assert mapped("--", "echo {item}", "a", "b", "c") == 0
    out, err = capsys.readouterr()
    assert sorted(line.split()[:2] for line in out.splitlines()) == [
        ["ok", "a"], ["ok", "b"], ["ok", "c"],
    ]  # fmt: skip
    assert err.splitlines()[-2:] == ["ok        3", "total     3"]
    assert mapped.mock.live_sandboxes == []


def test_a_failed_task_makes_the_exit_status_1_and_its_line_says_why(mapped, capsys) -> None:
    assert mapped("--", "exit-with-{item}", "0", "5") == 1
    out, err = capsys.readouterr()
    assert "failed    5" in out and "(exit 5)" in out
    assert "failed    1" in err


def test_jsonl_prints_one_object_per_task_with_its_output(mapped, capsys) -> None:
    assert mapped("--jsonl", "--", "echo {item}", "x", "exit-with-2") == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_item: dict[str, dict[str, Any]] = {line["item"]: line for line in lines}
    assert by_item["x"]["outcome"] == "ok" and by_item["x"]["stdout"] == "echo x\n"
    assert by_item["exit-with-2"]["outcome"] == "failed"
    assert by_item["exit-with-2"]["exitCode"] == 2
    assert {"sandboxId", "attempts", "seconds"} <= set(by_item["x"])


def test_items_come_from_a_file_too(mapped, capsys, tmp_path: Path) -> None:
    items = tmp_path / "items.txt"
    items.write_text("one\n\ntwo\n")
    assert mapped("--items-file", str(items), "--", "echo {item}", "zero") == 0
    out = capsys.readouterr().out
    assert sorted(line.split()[1] for line in out.splitlines()) == ["one", "two", "zero"]


def test_items_come_from_standard_input_with_a_dash(
    mapped, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("p\nq\n"))
    assert mapped("--items-file", "-", "--", "echo {item}") == 0
    out = capsys.readouterr().out
    assert sorted(line.split()[1] for line in out.splitlines()) == ["p", "q"]


def test_no_items_is_a_configuration_error(mapped, capsys) -> None:
    assert mapped("--", "echo {item}") == 2
    assert "no items" in capsys.readouterr().err
