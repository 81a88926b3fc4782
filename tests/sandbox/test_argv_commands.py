"""A command given as a list of arguments is quoted one by one, as ``shlex.join`` does."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, PiShipError, Sandbox, activate_sandbox
from piship_remote.sandbox._exec_engine import command_line
from piship_remote.testing import E2bServer

pytestmark = pytest.mark.timeout(20)

POLICY = {"required": True, "network": {"mode": "deny"}, "environment": {"allow": ["LANG"]}}


@pytest.fixture
def started(
    e2b_server: Callable[..., E2bServer], workspace: Path
) -> Iterator[tuple[Sandbox, list[str]]]:
    """A sandbox whose mock records the shell text of every command it starts."""
    lines: list[str] = []

    def command(start: dict[str, Any]) -> dict[str, Any]:
        lines.append(start["process"]["args"][-1])
        return {"stdout": "ok\n"}

    mock = e2b_server(command=command)
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url)
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        lines.clear()  # the readiness check
        yield sandbox, lines


def test_run_quotes_each_argument(started: tuple[Sandbox, list[str]]) -> None:
    sandbox, lines = started
    assert sandbox.run(["echo", "a b", "it's"]).stdout == "ok\n"
    assert len(lines) == 1
    assert lines[0].endswith(shlex.join(["echo", "a b", "it's"]))


def test_exec_quotes_each_argument(started: tuple[Sandbox, list[str]]) -> None:
    sandbox, lines = started
    assert sandbox.exec(("pytest", "-k", "a and b")).exit_code == 0
    assert lines[0].endswith("pytest -k 'a and b'")


def test_a_string_is_still_a_shell_command_line(started: tuple[Sandbox, list[str]]) -> None:
    sandbox, lines = started
    sandbox.run("echo a b | wc -w")
    assert lines[0].endswith("echo a b | wc -w")


@pytest.mark.parametrize("command", [5, b"echo hi", None, {"echo": "hi"}])
def test_a_command_of_the_wrong_type_is_a_type_error_before_any_request(
    started: tuple[Sandbox, list[str]], command: object
) -> None:
    sandbox, lines = started
    with pytest.raises(TypeError, match="command must be a str"):
        sandbox.run(command)  # type: ignore[arg-type]
    assert lines == []


def test_an_argument_of_the_wrong_type_is_named(started: tuple[Sandbox, list[str]]) -> None:
    sandbox, lines = started
    with pytest.raises(TypeError, match="command argument 1 must be a str, not int"):
        sandbox.exec(["sleep", 5])  # type: ignore[list-item]
    assert lines == []


def test_an_empty_argument_list_is_config_invalid(started: tuple[Sandbox, list[str]]) -> None:
    sandbox, _ = started
    with pytest.raises(PiShipError) as caught:
        sandbox.run([])
    assert caught.value.code == "CONFIG_INVALID"


def test_path_like_arguments_are_quoted_as_text() -> None:
    assert command_line(["cat", PurePosixPath("my dir/a.txt")]) == "cat 'my dir/a.txt'"
