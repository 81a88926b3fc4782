"""A pool's command task: only the literal ``{item}`` is replaced, by the item quoted as one
shell word; a command that cannot run is refused before any sandbox, one without ``{item}``
warns."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piship_remote import E2bCompatibleBackend, PiShipError, SandboxPool
from piship_remote.model.errors import CONFIG_INVALID
from piship_remote.pool._command import NoItemWarning, command_for
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY, exit_as_asked, pool_maker

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]


@pytest.fixture
def server(e2b_server: E2bFactory) -> E2bServer:
    return e2b_server(command=exit_as_asked, distinct_ids=True)


@pytest.fixture
def make_pool(server: E2bServer, workspace: Path) -> Iterator[Callable[..., SandboxPool]]:
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        with pool_maker(POLICY, backend, workspace) as make:
            yield make


def creates(server: E2bServer) -> int:
    return sum(1 for r in server.requests if r.method == "POST" and r.path == "/sandboxes")


@pytest.mark.parametrize(
    "command",
    ['echo "${HOME}" {item}', "awk '{print}' f && echo {item}", "echo {Item} {item}"],
)
def test_other_braces_reach_the_shell_as_written(make_pool, command: str) -> None:
    with make_pool(size=1) as pool:
        [result] = pool.map(command, ["x"])
    assert result.outcome == "ok"
    assert result.value.stdout == command.replace("{item}", "x") + "\n"


def test_the_item_is_one_quoted_shell_word(make_pool) -> None:
    with make_pool(size=1) as pool:
        [spaced, hostile] = pool.map("pytest {item}", ["a b.py", "x; rm -rf ~"])
    assert spaced.value.stdout == "pytest 'a b.py'\n"
    assert hostile.value.stdout == "pytest 'x; rm -rf ~'\n"


def test_every_item_placeholder_is_replaced() -> None:
    assert command_for("cp {item} out/{item}", 3) == "cp 3 out/3"


@pytest.mark.parametrize(
    ("command", "problem"),
    [("   ", "is empty"), ("echo 'open {item}", "quotation mark"), ("a\0{item}", "NUL")],
)
def test_a_command_that_cannot_run_is_refused_before_any_sandbox(
    make_pool, server: E2bServer, command: str, problem: str
) -> None:
    with make_pool(size=2) as pool, pytest.raises(PiShipError) as raised:
        pool.map(command, ["a"])
    assert raised.value.code == CONFIG_INVALID and problem in raised.value.message
    assert creates(server) == 0


def test_bash_ansi_quoting_is_not_mistaken_for_an_open_quote(make_pool) -> None:
    with make_pool(size=1) as pool:
        [result] = pool.map("echo $'it\\'s' {item}", ["x"])
    assert result.outcome == "ok"


def test_a_command_without_item_warns_at_the_callers_line(make_pool) -> None:
    with make_pool(size=1) as pool, pytest.warns(NoItemWarning, match="no {item}") as caught:
        pool.map("make test", [1])
    assert caught[0].filename == __file__


def test_imap_warns_at_the_callers_line_too(make_pool) -> None:
    with make_pool(size=1) as pool, pytest.warns(NoItemWarning) as caught:
        list(pool.imap("make test", [1]))
    assert caught[0].filename == __file__


def test_a_command_with_item_does_not_warn(make_pool) -> None:
    with make_pool(size=1) as pool, warnings.catch_warnings():
        warnings.simplefilter("error", NoItemWarning)
        assert [r.outcome for r in pool.map("echo {item}", [1])] == ["ok"]
