"""A create the service refuses for good (a wrong key, an unknown template) ends the pool's
creates: every later task gets that error at once, never another doomed create."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote import E2bCompatibleBackend
from piship_remote.model.errors import CONFIG_INVALID, CREDENTIAL_DENIED, SANDBOX_UNAVAILABLE
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY, exit_as_asked, pool_maker

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]


def creates(server: E2bServer) -> int:
    return sum(1 for r in server.requests if r.method == "POST" and r.path == "/sandboxes")


def test_a_refused_key_fails_every_task_with_at_most_one_create_per_slot(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    server = e2b_server(api_key="the-right-one", command=exit_as_asked, distinct_ids=True)
    backend = E2bCompatibleBackend(
        endpoint=server.url, envd_url=server.url, credential=lambda: "a-wrong-one"
    )
    with backend, pool_maker(POLICY, backend, workspace) as make, make(size=2, warm=2) as pool:
        results = pool.map("echo {item}", range(6))
    assert [r.outcome for r in results] == ["infra"] * 6
    assert {r.error.cause_code for r in results} == {CREDENTIAL_DENIED}
    assert {r.error.code for r in results} == {SANDBOX_UNAVAILABLE}  # activation's own code
    assert creates(server) <= 2


def test_an_unknown_template_is_a_configuration_error_never_retried(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    server = e2b_server(command=exit_as_asked, distinct_ids=True, create=404)
    backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url, template="nosuch")
    with backend, pool_maker(POLICY, backend, workspace) as make, make(size=1) as pool:
        results = pool.map("echo {item}", range(3))
    assert {r.error.code for r in results} == {CONFIG_INVALID}
    assert "no template 'nosuch'" in str(results[0].error)
    assert creates(server) == 1
