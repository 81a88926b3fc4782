"""``TaskResult.outcome`` is an ``Outcome``: a ``str`` enum; the strings keep working (§1.7)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import piship_remote
from piship_remote import E2bCompatibleBackend, Outcome, SandboxPool, TaskResult
from piship_remote.pool import OUTCOMES
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY, exit_as_asked, pool_maker

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]


def test_outcome_is_a_public_name() -> None:
    assert "Outcome" in piship_remote.__all__ and piship_remote.Outcome is Outcome


def test_the_outcomes_are_the_six_strings_in_their_order() -> None:
    assert [str(outcome) for outcome in OUTCOMES] == [
        "ok",
        "failed",
        "infra",
        "unknown",
        "timeout",
        "cancelled",
    ]


def test_an_outcome_compares_hashes_and_prints_as_its_string() -> None:
    assert Outcome.OK == "ok" and Outcome.OK == "ok"
    assert {"ok": 1}[Outcome.OK] == 1
    assert (f"{Outcome.INFRA}", f"{Outcome.INFRA:<7}|") == ("infra", "infra  |")
    assert json.dumps({"outcome": Outcome.TIMEOUT}) == '{"outcome": "timeout"}'


def test_a_task_result_made_with_a_string_holds_the_outcome() -> None:
    result = TaskResult("item", None, None, "failed", None, 1, 0.0)

    assert result.outcome is Outcome.FAILED


def test_a_task_result_refuses_an_outcome_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="sometimes"):
        TaskResult("item", None, None, "sometimes", None, 1, 0.0)


@pytest.fixture
def make_pool(e2b_server: E2bFactory, workspace: Path) -> Iterator[Callable[..., SandboxPool]]:
    server = e2b_server(command=exit_as_asked, distinct_ids=True)
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        with pool_maker(POLICY, backend, workspace) as make:
            yield make


def test_map_gives_outcomes_that_are_both_the_enum_and_the_string(make_pool) -> None:
    with make_pool(size=2) as pool:
        ok, failed = pool.map("exit-with-{item}", [0, 3])

    assert (ok.outcome, failed.outcome) == (Outcome.OK, Outcome.FAILED)
    assert (ok.outcome, failed.outcome) == ("ok", "failed")
