"""Activation fails closed and says what it left out: the network is denied unless a
policy allows it, dropped variables are named (never their values), and a workspace
that does not exist is a configuration error."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piship_remote import E2bCompatibleBackend, PiShipError, Sandbox, activate_sandbox
from piship_remote.testing import E2bServer

pytestmark = pytest.mark.timeout(20)

E2bFactory = Callable[..., E2bServer]


@pytest.fixture
def mock(e2b_server: E2bFactory) -> E2bServer:
    return e2b_server()


@pytest.fixture
def backend(mock: E2bServer) -> Iterator[E2bCompatibleBackend]:
    with E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url) as instance:
        yield instance


def test_a_policy_without_a_network_mode_denies_the_network(
    mock: E2bServer, backend: E2bCompatibleBackend, workspace: Path
) -> None:
    with activate_sandbox({}, backend=backend, workspace=workspace, env={}) as sandbox:
        assert sandbox.report.network == "deny"
        assert "network-deny" in sandbox.report.planes
    created = mock.find("POST", "/sandboxes")
    assert created[0].json()["allow_internet_access"] is False


@pytest.mark.parametrize("missing", ["no-such-dir", "no/such/dir"])
def test_a_workspace_that_does_not_exist_is_config_invalid_before_any_request(
    mock: E2bServer, backend: E2bCompatibleBackend, tmp_path: Path, missing: str
) -> None:
    path = tmp_path / missing
    with pytest.raises(PiShipError) as caught:
        activate_sandbox({"required": True}, backend=backend, workspace=path, env={})
    assert caught.value.code == "CONFIG_INVALID"
    assert str(path) in str(caught.value)
    assert "does not exist" in str(caught.value)
    assert mock.requests == []


def test_a_workspace_that_is_a_file_is_config_invalid(
    backend: E2bCompatibleBackend, tmp_path: Path
) -> None:
    path = tmp_path / "file.txt"
    path.write_text("x")
    with pytest.raises(PiShipError, match="is not a directory") as caught:
        activate_sandbox({"required": True}, backend=backend, workspace=path, env={})
    assert caught.value.code == "CONFIG_INVALID"


def activate(backend: E2bCompatibleBackend, workspace: Path, env: dict[str, str]) -> Sandbox:
    policy = {"required": True, "environment": {"allow": ["LANG", "NOTE"]}}
    return activate_sandbox(policy, backend=backend, workspace=workspace, env=env)


def test_given_variables_the_allow_list_drops_are_named_on_the_report_and_logged(
    backend: E2bCompatibleBackend, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"LANG": "C", "FOO": "bar-value", "NOTE": "ghp_" + "a" * 36, "GH_TOKEN": "tok-value"}
    with caplog.at_level(logging.WARNING, logger="piship_remote"):
        sandbox = activate(backend, workspace, env)
    with sandbox:
        warnings = sandbox.report.warnings
    assert any('environment.allow: ["FOO"]' in w and "FOO" in w for w in warnings)
    assert "NOTE was not sent to the sandbox: its value is a token-shaped credential" in warnings
    assert any("GH_TOKEN" in w and "never sent" in w for w in warnings)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    about_env = [w for w in warnings if "sent to the sandbox" in w]
    assert len(about_env) == 3
    assert all(f"environment: {warning}" in logged for warning in about_env)
    shown = "\n".join([*warnings, *logged])
    for value in ("bar-value", "ghp_", "tok-value"):
        assert value not in shown


def test_the_host_environment_by_default_is_not_listed_name_by_name(
    backend: E2bCompatibleBackend, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PISHIP_TEST_UNLISTED", "x")
    policy = {"required": True, "environment": {"allow": ["LANG"]}}
    with activate_sandbox(policy, backend=backend, workspace=workspace) as sandbox:
        assert not any("PISHIP_TEST_UNLISTED" in w for w in sandbox.report.warnings)


def test_an_env_given_to_exec_has_its_dropped_names_logged_once(
    backend: E2bCompatibleBackend, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with activate(backend, workspace, {}) as sandbox:
        with caplog.at_level(logging.WARNING, logger="piship_remote"):
            sandbox.exec("true", env={"FOO": "bar-value", "NOTE": "sk-live-abcdef123456"})
            sandbox.exec("true", env={"FOO": "bar-value", "NOTE": "sk-live-abcdef123456"})
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum('environment.allow: ["FOO"]' in m for m in logged) == 1
    assert sum("NOTE was not sent" in m for m in logged) == 1
    assert not any("bar-value" in m or "sk-live" in m for m in logged)
